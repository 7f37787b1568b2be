"""The pooler contract: a pooler declares what it needs (`Needs`) so the encoder computes exactly that, once, for
all poolers; it maps the encoder's output of a batch to sentence embeddings. The poolers themselves live in
`poolers/`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

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
    router_logits: needs the router logits of every mixture-of-experts block (MoEE's routing weights); only MoE
        decoders record them, which the pooler's `check_model` checks before any forward.
    bidirectional: runs the decoder with the causal mask removed (LLM2Vec); defined for some families only, which the
        pooler's `check_model` checks from the model's config before any weight loads.
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
    router_logits: bool = False
    bidirectional: bool = False


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

    def combine(self, embeddings: Mapping[str, np.ndarray]) -> np.ndarray:
        """This pooler's `[N, D]` embeddings from those of its `parts()` (keyed by part name): their plain mean in
        float64 (MetaEOL's `view(-1, K, D).mean(1)`); poolers that combine otherwise (ensembles) override it."""
        parts = self.parts() or []
        return np.mean([embeddings[part.name] for part in parts], axis=0, dtype=np.float64).astype(np.float32)

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
