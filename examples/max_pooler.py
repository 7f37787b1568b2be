"""Max pooling as a pooler of your own, written outside promptemb: each dimension's largest value over the sentence's
tokens of one layer (the last by default), [CLS] and [SEP] included and padding never, as sentence-transformers'
`Pooling(pooling_mode="max")` computes it.

    python evaluate.py imports=[max_pooler] 'poolers=[max,mean]'
    python evaluate.py imports=[max_pooler] 'poolers=[max]' +pooler_args.max.layer=-2

(docs/extending.md walks through it.)
"""

from __future__ import annotations

import torch

from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers import Needs, Pooler, register_pooler


@register_pooler("max")
class MaxPooler(Pooler):
    """e_d = max over t in T of h^(layer)_{t,d}; T = every token of the plain `[CLS] sentence [SEP]` input."""

    def __init__(self, name: str = "max", layer: int = -1):
        super().__init__(name)
        self.layer = layer

    @property
    def needs(self) -> Needs:
        # what the shared forward pass must keep for this pooler: one layer's hidden states of the plain input
        return Needs(layers=(self.layer,))

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        states = out.layer(self.layer)  # [batch, tokens, width]
        padding = out.attention_mask[..., None] == 0  # the batch is padded to its longest input
        return states.masked_fill(padding, float("-inf")).amax(dim=1)
