"""CoSENT (Su 2022, "CoSENT: a more effective sentence embedding than Sentence-BERT"; Huang et al., IEEE/ACM TASLP
2024, "CoSENT: Consistent Sentence Embedding via Similarity Ranking"): a ranking loss over the scored pairs of a
batch, the cosine term of AnglE (Li & Li, ACL 2024) and sentence-transformers' `CoSENTLoss`.

    L = log(1 + Σ_{(i, j): y_i < y_j} exp(λ (s_i − s_j)))

with s_k the similarity of pair k, y_k its gold score and λ the scale (AnglE's `cosine_tau`, 20). Only the order of
the scores matters: any increasing rescaling of y gives the same loss. The arithmetic is angle_emb 0.6.1's
`cosine_loss` (SeanLee97/AnglE@5155458 angle_emb/loss.py): the λ-scaled differences of every (i, j), those with
y_i ≥ y_j pushed down by 1e12 (exactly zero after exp in float32), a 0 prepended, `logsumexp` — in float32 even under
autocast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: AnglE's (and sentence-transformers') default scale λ of the cosine term, the inverse of a 0.05 temperature
COSENT_SCALE = 20.0
#: what the official code subtracts from the pairs that do not count (y_i >= y_j)
MASKED = 1e12


def ranking_loss(similarities: torch.Tensor, scores: torch.Tensor, scale: float = COSENT_SCALE) -> torch.Tensor:
    """log(1 + Σ_{y_i < y_j} exp(scale · (s_i − s_j))) over the pairs of `similarities` [n] with gold `scores` [n]."""
    if similarities.shape != scores.shape or similarities.dim() != 1:
        raise ValueError(f"one similarity per gold score: got {tuple(similarities.shape)} and {tuple(scores.shape)}")
    with torch.autocast(device_type=similarities.device.type, enabled=False):
        scaled = similarities.float() * scale
        ordered = (scores[:, None] < scores[None, :]).float()
        differences = (scaled[:, None] - scaled[None, :] - (1 - ordered) * MASKED).view(-1)
        return torch.logsumexp(torch.cat((differences.new_zeros(1), differences)), dim=0)


def pairwise_cosine(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """cos(first_k, second_k) for every row k, in float32 (the official order: normalise, multiply, sum)."""
    with torch.autocast(device_type=first.device.type, enabled=False):
        return (F.normalize(first.float(), p=2, dim=1) * F.normalize(second.float(), p=2, dim=1)).sum(dim=1)


def cosent_loss(first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor,
                scale: float = COSENT_SCALE) -> torch.Tensor:
    """CoSENT of the pairs (first_k, second_k) [n, D] with gold `scores` [n]: `ranking_loss` of their cosines."""
    return ranking_loss(pairwise_cosine(first, second), scores, scale)
