"""Pearson correlation loss between the similarities of a batch of sentence pairs and their gold scores (Pcc-tuning:
Zhang & Li, EMNLP 2024, "Pcc-tuning: Breaking the Contrastive Learning Ceiling in Semantic Textual Similarity";
official code ZBWpro/Pcc-tuning@71768f8 code/tune.py `PearsonCorrelationLoss`).

    L = 1 − ρ(s, y),   s_k = cos(u_k, v_k),   y_k the gold score of pair k,   over the n pairs of the batch

`pcc_tuning` (the official arithmetic): ρ = mean((s − s̄)(y − ȳ)) / (√var(s) · √var(y)) with torch's unbiased
variance (÷ n−1) under a covariance averaged over n, i.e. Pearson's r scaled by (n−1)/n. `exact`: Pearson's r (the
clean variant; the same gradient direction, (n−1)/n times larger gradient, and a loss that reaches 0 at r = 1).
Affine in the scores: any positive rescaling of y gives the same loss. Constant scores (or similarities) have no
correlation: the loss is then NaN, as in the official code. Computed in float32 even under autocast.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch

PearsonVariant = Literal["pcc_tuning", "exact"]
PEARSON_VARIANTS = typing.get_args(PearsonVariant)


def pearson_loss(similarities: torch.Tensor, scores: torch.Tensor,
                 variant: PearsonVariant = "pcc_tuning") -> torch.Tensor:
    """1 − ρ(similarities, scores) over the n entries of two [n] tensors (see the module docstring)."""
    if similarities.shape != scores.shape or similarities.dim() != 1:
        raise ValueError(f"one similarity per gold score: got {tuple(similarities.shape)} and {tuple(scores.shape)}")
    if variant not in PEARSON_VARIANTS:
        raise ValueError(f"unknown Pearson variant {variant!r}; valid: {', '.join(PEARSON_VARIANTS)}")
    with torch.autocast(device_type=similarities.device.type, enabled=False):
        x, y = similarities.float(), scores.float()
        dx, dy = x - torch.mean(x), y - torch.mean(y)
        if variant == "pcc_tuning":  # the official lines
            pearson = torch.mean(dx * dy) / (torch.sqrt(torch.var(x)) * torch.sqrt(torch.var(y)))
        else:
            pearson = (dx * dy).sum() / torch.sqrt((dx * dx).sum() * (dy * dy).sum())
        return -pearson + 1
