"""AnglE's angle term (Li & Li, ACL 2024, "AoE: Angle-optimized Embeddings for Semantic Textual Similarity", §3.3;
angle_emb 0.6.1 `angle_loss`, SeanLee97/AnglE@5155458 angle_emb/loss.py; sentence-transformers' `AnglELoss`).

Each embedding is read as a complex vector, its first half the real parts and its second half the imaginary parts:
u = a + ib, v = c + id. The quotient u / v, scaled by |v| / |u| (the official code divides by the norms of the whole
halves, not per component), has real part Σ(ac + bd) / (|u||v|) = cos(u, v) and imaginary part
Σ(bc − ad) / (|u||v|). The official code then pools the concatenation [re, im] (`sum`, its default, or `mean` =
sum / D) and takes the absolute value:

    Δ(u, v) = |Σ_k re_k + Σ_k im_k|          (`sum`)

and ranks the pairs by it exactly as CoSENT ranks cosines: L = log(1 + Σ_{y_i < y_j} exp(λ (Δ_i − Δ_j))), λ =
`angle_tau` (20). Surprising, and kept so the numbers match: Δ, called the "angle difference", is ranked as a
similarity (pairs with higher gold scores are pushed to larger Δ), and it is the absolute value of the sum of the
real and imaginary parts, not an angle. sentence-transformers' `pairwise_angle_sim` is the same quantity written as
|cos + sin| after L2 normalisation. An odd width cannot be split into halves (the official code fails on it).
"""

from __future__ import annotations

from typing import Literal

import torch

from promptemb.lightning_modules.cosent import ranking_loss

#: how Δ pools the concatenated real and imaginary parts (angle_emb's `angle_pooling_strategy`)
AnglePooling = Literal["sum", "mean"]
#: AnglE's default scale λ of the angle term (`angle_tau`)
ANGLE_SCALE = 20.0


def angle_difference(first: torch.Tensor, second: torch.Tensor, pooling: AnglePooling = "sum") -> torch.Tensor:
    """Δ(first_k, second_k) for every row k [n, D] (D even), in float32, in the official order of operations."""
    if first.shape[-1] % 2:
        raise ValueError(f"the angle term splits each embedding into a real and an imaginary half; width "
                         f"{first.shape[-1]} is odd")
    with torch.autocast(device_type=first.device.type, enabled=False):
        a, b = torch.chunk(first.float(), 2, dim=1)
        c, d = torch.chunk(second.float(), 2, dim=1)
        z = torch.sum(c**2 + d**2, dim=1, keepdim=True)
        dz = torch.sum(a**2 + b**2, dim=1, keepdim=True) ** 0.5
        dw = z**0.5
        re = (a * c + b * d) / z / (dz / dw)
        im = (b * c - a * d) / z / (dz / dw)
        parts = torch.cat((re, im), dim=1)
        if pooling == "sum":
            pooled = parts.sum(dim=1)
        elif pooling == "mean":
            pooled = parts.mean(dim=1)
        else:
            raise ValueError(f"unknown angle pooling {pooling!r}; valid: sum, mean")
        return pooled.abs()


def angle_loss(first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor, scale: float = ANGLE_SCALE,
               pooling: AnglePooling = "sum") -> torch.Tensor:
    """The angle term of the pairs (first_k, second_k) [n, D] with gold `scores` [n]."""
    return ranking_loss(angle_difference(first, second, pooling), scores, scale)
