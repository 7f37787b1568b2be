"""What a decoder prompt method adds to an input form: an Echo template, a hook on the forward pass (Token
Prepending, Contrastive Prompting), LLM2Vec's instruction format, bidirectional attention. Plain records;
`encoder/decoder.py` applies them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlaceholderVector:
    """Token Prepending's `<PST>` input embedding and where it came from: `tokenizer` (the model's own `<PST>` row),
    `file` (a `.npy` vector) or `random` (N(0, 1), seeded); `record` holds the source's details for provenance."""

    values: tuple[float, ...]
    source: str
    record: tuple[tuple[str, str | int], ...] = ()

    def describe(self) -> dict:
        return {"placeholder_source": self.source, **{f"placeholder_{key}": value for key, value in self.record}}


@dataclass(frozen=True)
class TokenPrepending:
    """Before each layer i with `start` <= i < `exit` (0-based), the `<PST>` position's input is overwritten with that
    layer's input at the last position; layer 0 sees the `<PST>` embedding: `vector` once resolved from the model
    (`encoder/placeholder.py`), else drawn from N(0, 1) with `seed`."""

    start: int = 1
    exit: int = 7
    seed: int = 3407
    vector: PlaceholderVector | None = None

    def describe(self) -> dict:
        record = {"method": "token_prepending", "start": self.start, "exit": self.exit}
        if self.vector is None:
            return {**record, "placeholder_source": "random", "placeholder_seed": self.seed}
        return {**record, **self.vector.describe()}


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
class LLM2VecInput:
    """LLM2Vec's input (McGill-NLP/llm2vec `LLM2Vec.encode`): `instruction.strip() + " " + sentence` (the sentence
    alone without an instruction), `suffix` appended to the right-stripped sentence (the `eos_token` pooling mode's
    end text; None: nothing), tokenized whole with the tokenizer's special tokens. The pooled span is the LAST n
    tokens, n = the length of `sentence + suffix` tokenized alone without special tokens (the official `embed_mask`);
    `skip_instruction` false pools every real token instead."""

    instruction: str = ""
    suffix: str | None = None
    skip_instruction: bool = True

    def describe(self) -> dict:
        return {"instruction": self.instruction, "eos_suffix": self.suffix, "skip_instruction": self.skip_instruction}


@dataclass(frozen=True)
class DecoderForm:
    """What a decoder prompt method adds to an `InputForm`: an Echo template, a hook on the forward, LLM2Vec's
    instruction format; `bidirectional` runs the decoder with the causal mask removed (every token sees every real
    token: LLM2Vec)."""

    echo_template: str | None = None
    prepending: TokenPrepending | None = None
    contrast: ContrastivePrompting | None = None
    llm2vec: LLM2VecInput | None = None
    bidirectional: bool = False

    def describe(self) -> dict:
        record: dict = {}
        if self.echo_template is not None:
            record["echo_template"] = self.echo_template
        if self.llm2vec is not None:
            record.update(self.llm2vec.describe())
        if self.bidirectional:
            record["attention"] = "bidirectional"
        for hook in (self.prepending, self.contrast):
            if hook is not None:
                record.update(hook.describe())
        return record
