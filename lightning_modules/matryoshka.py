"""Matryoshka representation learning (Kusupati et al. 2022, "Matryoshka Representation Learning"): the contrastive
loss summed over truncated prefixes of the representation, so its first d components are an embedding of their own.

    L = Σ_k w_k · InfoNCE(a[:, :d_k], p[:, :d_k], n[:, :d_k])

with InfoNCE the recipe's (cosine / τ, normalisation after truncation): sentence-transformers' `MatryoshkaLoss`
around `MultipleNegativesRankingLoss(scale=1/τ)`, with its semantics — only the listed widths are trained (list the
full width to keep the plain loss), weights default to 1, terms summed from the widest down.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from promptemb.common.errors import ConfigError, UserError
from promptemb.encoder.loading import resolve_model_path
from promptemb.lightning_modules.losses import info_nce

log = logging.getLogger(__name__)

#: `truncate(tensor, d)`: the first d components of a representation (a recipe may read them elsewhere)
Truncate = Callable[[torch.Tensor, int], torch.Tensor]


def check_matryoshka_settings(dims: Sequence[int] | None, weights: Sequence[float] | None,
                              key: str = "model.matryoshka_dims") -> None:
    """What is wrong with a (dims, weights) pair, without a model: weights without dims, lengths that differ, a
    width listed twice, a width below 1 or a weight <= 0 (the type hints refuse those first, where checked)."""
    weights_key = key.replace("matryoshka_dims", "matryoshka_weights")
    if dims is None:
        if weights is not None:
            raise ConfigError(f"{weights_key} is set but {key} is not: set {key} (the widths these weigh) or drop "
                              f"{weights_key}")
        return
    dims = list(dims)
    if not dims:
        raise ConfigError(f"{key}=[] trains no width; list widths such as [384,128,64], or set {key}=null")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(f"{key}={dims}: every width must be an integer >= 1")
    if len(set(dims)) != len(dims):
        raise ConfigError(f"{key}={dims} lists a width twice; list each once (weigh it with {weights_key})")
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(dims):
            raise ConfigError(f"{weights_key} has {len(weights)} value(s) but {key} has {len(dims)}: give one "
                              "weight per width, in the same order")
        if any(isinstance(w, bool) or not isinstance(w, int | float) or not w > 0 for w in weights):
            raise ConfigError(f"{weights_key}={weights}: every weight must be a number > 0")


def configured_width(name_or_path) -> int | None:
    """The hidden size a local model (directory or `package:MODULE`) declares in its config.json, read without
    loading it; None for anything else (a Hub name: the recipe checks the loaded model instead)."""
    if not isinstance(name_or_path, str):
        return None
    try:
        directory = Path(resolve_model_path(name_or_path)).expanduser()
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (UserError, OSError, ValueError):
        return None
    width = config.get("hidden_size", config.get("d_model")) if isinstance(config, dict) else None
    return width if isinstance(width, int) and not isinstance(width, bool) else None


@dataclass(frozen=True)
class Matryoshka:
    """The widths (widest first) and their weights; `check_width` against the representation they truncate."""

    dims: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def build(cls, dims: Sequence[int] | None, weights: Sequence[float] | None = None) -> Matryoshka | None:
        """None without dims; weights default to 1 each; sorted by width, widest first (as MatryoshkaLoss)."""
        check_matryoshka_settings(dims, weights)
        if dims is None:
            return None
        weights = [1.0] * len(dims) if weights is None else [float(w) for w in weights]
        pairs = sorted(zip((int(d) for d in dims), weights, strict=True), key=lambda pair: pair[0], reverse=True)
        return cls(tuple(d for d, _ in pairs), tuple(w for _, w in pairs))

    def check_width(self, width: int, owner: str, key: str = "model.matryoshka_dims", warn: bool = True) -> None:
        """Every width fits the `width`-wide representation; a list without the full width trains the full
        representation only through its prefixes (`warn`: say so, as sentence-transformers does)."""
        too_wide = [d for d in self.dims if d > width]
        if too_wide:
            raise ConfigError(f"{key}={list(self.dims)}: {too_wide[0]} is wider than {owner}'s {width}-dimensional "
                              f"representation; use widths <= {width}, e.g. [{width},{max(1, width // 3)}]")
        if warn and width not in self.dims:
            log.warning("%s=%s does not list the full width %d: the full representation is trained only through "
                        "its prefixes; add %d to train it as well", key, list(self.dims), width, width)

    def describe(self) -> dict:
        return {"dims": list(self.dims), "weights": list(self.weights)}

    def loss(self, anchors: torch.Tensor, positives: torch.Tensor, hard_negatives: torch.Tensor | None,
             temperature: float, truncate: Truncate | None = None) -> torch.Tensor:
        """Σ_k w_k · InfoNCE of the first d_k components (`truncate(x, d)`, default `x[..., :d]`) of every row."""
        cut = truncate or (lambda tensor, dim: tensor[..., :dim])
        total = None
        for dim, weight in zip(self.dims, self.weights, strict=True):
            term = weight * info_nce(cut(anchors, dim), cut(positives, dim), temperature,
                                     None if hard_negatives is None else cut(hard_negatives, dim))
            total = term if total is None else total + term
        return total
