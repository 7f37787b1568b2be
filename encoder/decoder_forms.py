"""What a decoder prompt method adds to an input form: an Echo template, or a hook on the forward pass (Token
Prepending, Contrastive Prompting). Plain records; `encoder/decoder.py` applies them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenPrepending:
    """Before each layer i with `start` <= i < `exit` (0-based), the `<PST>` position's input is overwritten with that
    layer's input at the last position; layer 0 sees the `<PST>` embedding, drawn from N(0, 1) with `seed`."""

    start: int = 1
    exit: int = 7
    seed: int = 3407

    def describe(self) -> dict:
        return {"method": "token_prepending", "start": self.start, "exit": self.exit, "placeholder_seed": self.seed}


@dataclass(frozen=True)
class ContrastivePrompting:
    """At layer `layer` (0-based), the input of the attention output projection (the concatenated heads) at the last
    position becomes `coeff·(A − B)`: A its own value, B the same position's value for the auxiliary prompt."""

    auxiliary: str
    layer: int = 4
    coeff: float = 0.5

    def describe(self) -> dict:
        return {"method": "contrastive_prompting", "auxiliary_template": self.auxiliary, "act_layer": self.layer,
                "coeff": self.coeff}


@dataclass(frozen=True)
class DecoderForm:
    """What a decoder prompt method adds to an `InputForm`: an Echo template, or a hook on the forward."""

    echo_template: str | None = None
    prepending: TokenPrepending | None = None
    contrast: ContrastivePrompting | None = None

    def describe(self) -> dict:
        record: dict = {}
        if self.echo_template is not None:
            record["echo_template"] = self.echo_template
        for hook in (self.prepending, self.contrast):
            if hook is not None:
                record.update(hook.describe())
        return record
