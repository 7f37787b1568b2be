"""[CLS] pooling."""

from __future__ import annotations

import torch

from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler


class CLSPooler(Pooler):
    """e = h^(l)_0: the hidden state of the first token ([CLS]) at layer `layer` (default: last), plain input."""

    def __init__(self, name: str = "cls", layer: int = -1):
        super().__init__(name)
        self.layer = layer

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,))

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        return out.layer(self.layer)[:, 0]
