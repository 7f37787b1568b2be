"""Ditto: diagonal-attention weighted pooling (Chen et al., 2023, "Ditto: A Simple and Efficient Approach to Improve
Sentence Embeddings", Eq. 2-3)."""

from __future__ import annotations

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler


def attention_diagonals(attentions: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A_ii of every layer and head: `[B, layers, heads, T]` from per-layer probabilities `[B, H, T, T]`."""
    return torch.stack([layer.diagonal(dim1=-2, dim2=-1) for layer in attentions], dim=1)


def diagonal_weighted_sum(states: torch.Tensor, diagonal: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_i mask_i·A_ii·h_i, NOT normalised by Σ A_ii (as the reference); `diagonal` [B, ..., T], `states` [B, T, D]
    -> [B, ..., D]."""
    weights = diagonal * mask.to(diagonal.dtype).view(mask.shape[0], *([1] * (diagonal.dim() - 2)), -1)
    return torch.einsum("b...t,btd->b...d", weights.to(states.dtype), states)


class DittoPooler(Pooler):
    """e = Σ_i mask_i · A^(l,h)_ii · (h^(first)_i + h^(last)_i) / 2 over ALL tokens ([CLS]/[SEP] included) of the
    plain input, or of the prompt-templated input (template and [MASK] tokens included) when `templated`.

    A^(l,h) = attention probabilities of head `head` in transformer layer `layer`, both 0-indexed (layer 0 = the
    first transformer layer, `out.attentions[0]`), so the defaults 0/9 are the reference's bert-base-uncased head
    (roberta-base 0/4, electra-base 0/10). The reference's "first-last" uses `hidden_states[0]` (embedding output)
    and `hidden_states[-1]`: `layers=(0, -1)`; the average of the listed layers is taken, so any layers can be named.
    Choose the head for a new model with `scripts/ditto_head_search.py` (grid over all layer x head on STS-B dev).
    """

    def __init__(self, name: str = "ditto", layer: int = 0, head: int = 9,
                 layers: tuple[int, ...] | list[int] = (0, -1), templated: bool = False):
        super().__init__(name)
        self.layer, self.head, self.layers = int(layer), int(head), tuple(layers)
        self.templated = templated

    @property
    def needs(self) -> Needs:
        return Needs(layers=self.layers, attentions=True, templated=self.templated)

    def check_model(self, config) -> None:
        layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
        if not (0 <= self.layer < layers and 0 <= self.head < heads):
            raise ConfigError(
                f"ditto layer {self.layer} / head {self.head} is out of range for a model with {layers} layers x "
                f"{heads} heads (0-indexed: layer 0..{layers - 1}, head 0..{heads - 1}); "
                "find the best with scripts/ditto_head_search.py"
            )

    def arguments(self) -> dict:
        return {"attention_layer": self.layer, "attention_head": self.head}

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        diagonal = out.attentions[self.layer][:, self.head].diagonal(dim1=-2, dim2=-1)
        states = torch.stack([out.layer(k) for k in self.layers]).mean(0)
        return diagonal_weighted_sum(states, diagonal, out.attention_mask)


class DittoHeadGrid(Pooler):
    """Every layer x head Ditto embedding at once, flattened to `[B, layers·heads·D]` (row-major layer, head, dim),
    for the head search: one forward pass scores all heads. Same formula as `DittoPooler`."""

    def __init__(self, name: str = "ditto_grid", layers: tuple[int, ...] | list[int] = (0, -1)):
        super().__init__(name)
        self.layers = tuple(layers)

    @property
    def needs(self) -> Needs:
        return Needs(layers=self.layers, attentions=True)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        states = torch.stack([out.layer(k) for k in self.layers]).mean(0)
        grid = diagonal_weighted_sum(states, attention_diagonals(out.attentions), out.attention_mask)
        return grid.flatten(1)
