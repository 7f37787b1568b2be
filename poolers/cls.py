"""[CLS] pooling."""

from __future__ import annotations

import torch

from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler


class CLSPooler(Pooler):
    """e = h^(l)_0: the hidden state of the first token ([CLS]) at layer `layer` (default: last), plain input; with a
    trained `head` (a recipe's, e.g. DCPCSE's supervised MLP tanh(W h + b)), e = head(h^(l)_0)."""

    def __init__(self, name: str = "cls", layer: int = -1, head: torch.nn.Module | None = None):
        super().__init__(name)
        self.layer = layer
        self.head = head

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,))

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        state = out.layer(self.layer)[:, 0]
        return state if self.head is None else self.head(state)
