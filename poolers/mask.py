"""PromptBERT [MASK] pooling."""

from __future__ import annotations

import torch

from encoder.outputs import EncoderOutput
from poolers.base import Needs, Pooler, masked_mean


class MaskPooler(Pooler):
    """e = (1/|M|) Σ_{t∈M} h^(l)_t over the template's [MASK] positions M (PromptBERT Eq. 2, h = h_[MASK]).

    Templates with several [MASK] tokens average their states. Layer `layer` defaults to the last one.
    """

    def __init__(self, name: str = "mask", layer: int = -1):
        super().__init__(name)
        self.layer = layer

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, mask_token=True)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        return masked_mean(out.layer(self.layer), out.mask_token)
