"""Static word-embedding pooling."""

from __future__ import annotations

import torch

from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler, masked_mean


class StaticPooler(Pooler):
    """e = (1/|T|) Σ_{t∈T} E[x_t]: mean of the input word-embedding table rows of every non-padding token.

    E is the word-embedding matrix only (no position or segment embeddings, no LayerNorm); no transformer layer runs.
    """

    def __init__(self, name: str = "static"):
        super().__init__(name)

    @property
    def needs(self) -> Needs:
        return Needs(word_embeddings=True)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        return masked_mean(out.word_embeddings, out.attention_mask)
