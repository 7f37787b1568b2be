"""Pooler interface: each pooler declares what it needs so the encoder computes exactly that, once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from promptemb.common.errors import ConfigError
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.outputs import EncoderOutput


@dataclass(frozen=True)
class Needs:
    """What a pooler reads from the forward pass.

    layers: hidden-state indices (0 = embeddings, negatives count from the last layer).
    layers_from: also every layer from this index to the last (SBERT-WK), resolved once the model depth is known.
    templated: pool over the prompt-templated input (else the plain `[CLS] sentence [SEP]` input).
    mask_token: needs `[MASK]` positions (template must contain `[MASK]`, tokenizer must have a mask token).
    attentions: needs attention probabilities (eager attention).
    word_embeddings: needs rows of the input word-embedding table.
    mlm_head: needs the masked-language-model head (the encoder loads the MLM variant of the checkpoint).
    template_bias: needs the template bias of template denoising at `layers` (templated inputs only).
    decoder: needs a decoder (causal LM): a decoder prompt method pooling the last token or a span.
    """

    layers: tuple[int, ...] = ()
    layers_from: int | None = None
    templated: bool = False
    mask_token: bool = False
    attentions: bool = False
    word_embeddings: bool = False
    mlm_head: bool = False
    template_bias: bool = False
    decoder: bool = False


class Pooler(ABC):
    """Maps an `EncoderOutput` of a batch to `[B, D]` sentence embeddings."""

    def __init__(self, name: str):
        self.name = name

    @property
    @abstractmethod
    def needs(self) -> Needs: ...

    @abstractmethod
    def __call__(self, out: EncoderOutput) -> torch.Tensor: ...

    @property
    def label(self) -> str:
        """Name in score tables; fitted poolers add the corpus they were fitted on, e.g. `idf(T)`."""
        return self.name

    def check_model(self, config) -> None:
        """Raise `ConfigError` if this pooler cannot run on a model with this Hugging Face config (before any
        forward pass). Most poolers are checked through `needs` alone."""
        return None

    def input_form(self) -> InputForm | None:
        """The pooler's own input form (a decoder method's template, sentence rule and forward hooks), used instead of
        the run's template; its `max_sentence_tokens` is replaced by the run's. None: the run's form."""
        return None

    def parts(self) -> list[Pooler] | None:
        """Poolers whose embeddings this one averages (MetaEOL's prompts), each run on its own input form; None for
        a pooler that reads one forward pass itself."""
        return None

    def bind_tokenizer(self, tokenizer) -> None:
        """Give the pooler the tokenizer, for poolers whose token weights depend on the vocabulary."""
        return None

    def bind_encoder(self, encoder) -> None:
        """Give the pooler the encoder itself, for poolers fitted through the encoder's own forward pass (the Avg.
        static model)."""
        return None

    def describe(self) -> dict:
        """Provenance record: type, layers, input form and own arguments of this pooler."""
        needs = self.needs
        record = {
            "type": type(self).__name__,
            "layers": list(needs.layers),
            "input": "templated" if needs.templated else "plain",
        }
        if needs.layers_from is not None:
            record["layers_from"] = needs.layers_from
        return {**record, **self.arguments()}

    def arguments(self) -> dict:
        """Pooler-specific arguments recorded in provenance (beyond layers and input form)."""
        return {}


def pooled_tokens(out: EncoderOutput, include_mask: bool = True) -> torch.Tensor:
    """0/1 `[B, T]` of the tokens to pool: every non-padding token, minus the template's [MASK] tokens when
    `include_mask` is False (seed 001's templated average "without [MASK]")."""
    if include_mask:
        return out.attention_mask
    return out.attention_mask * (~out.mask_token).to(out.attention_mask.dtype)


def require_template_for(name: str, templated: bool, include_mask: bool) -> None:
    """`include_mask=False` only means something on a templated input (a plain input has no [MASK])."""
    if not include_mask and not templated:
        raise ConfigError(f"pooler {name!r}: include_mask=false needs templated=true (a plain input has no [MASK])")


def masked_mean(states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_t w_t·h_t / Σ_t w_t over the token axis; `states` [B, T, D], `weights` [B, T] (0/1 or soft)."""
    weights = weights.to(states.dtype)
    return (states * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp_min(1e-9)
