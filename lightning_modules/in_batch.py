"""AnglE's in-batch negative term (Li & Li, ACL 2024, §3.2; angle_emb 0.6.1 `in_batch_negative_loss` and
`contrastive_with_negative_loss`, SeanLee97/AnglE@5155458 angle_emb/loss.py).

Pairs with scores (the official "format A"): the 2B embeddings of a batch of B pairs in the collator's zigzag order
[x_0, x'_0, x_1, x'_1, ...], every row against every other row (itself excluded), cosine × λ (`ibn_tau`, 20):

    L = (1 / 2B) Σ_i Σ_j t_ij · −log softmax_j(λ cos(r_i, r_j)),     j ≠ i

The official targets t (`in_batch_targets`) are built from the scores truncated to integers, ⌊y⌋ (`Tensor.int()`):
t_ij = 1 when j · ⌊y_j⌋ = partner(i) · ⌊y_i⌋, rows of a pair with ⌊y⌋ = 0 having none. So a pair whose score is at
least 1 is a positive pair (0.8 is not; 1.0 and 4.6 are alike), and, surprisingly, a row also gets every j whose
index times score collides with its partner's (partner 2 with score 3 and row 6 with score 1: both 6): the official
numbers need these extra targets, and each counts in full (the log-probabilities are summed, not averaged). Rows
without a target still count in the mean. `partner_targets` is the clean variant: exactly the partner, for pairs
scoring at least `min_score`.

Triplets (the official "format C"): InfoNCE of the queries against the positives (`ibn_w`), and against the
positives followed by the hard negatives (`cln_w`), both cosine × `ibn_tau`: `contrastive_loss`.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from promptemb.lightning_modules.cosent import MASKED

#: which rows are an in-batch term's targets on scored pairs: angle_emb's (index collisions included) or the
#: partner alone
InBatchTargets = Literal["angle_emb", "partner"]
#: AnglE's default scale λ of the in-batch terms (`ibn_tau`), the inverse of a 0.05 temperature
IBN_SCALE = 20.0


def zigzag(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """[first_0, second_0, first_1, second_1, ...]: the official collator's row order of a batch of pairs."""
    return torch.stack((first, second), dim=1).reshape(-1, *first.shape[1:])


def partners(rows: int, device: torch.device | None = None) -> torch.Tensor:
    """The other row of each row's pair in zigzag order: 1, 0, 3, 2, ..."""
    index = torch.arange(rows, device=device)
    return index + 1 - index % 2 * 2


def in_batch_targets(scores: torch.Tensor) -> torch.Tensor:
    """angle_emb 0.6.1's target matrix [2B, 2B] of zigzag rows whose scores are `scores` [2B] (each pair's score on
    both of its rows): `make_target_matrix` inside `in_batch_negative_loss`, integer arithmetic and all."""
    labels = scores.float().int()
    index = torch.arange(scores.shape[0], dtype=torch.int32, device=scores.device)
    columns = index * labels + (labels == 0).int() * -2
    rows = partners(scores.shape[0], scores.device).int() * labels + (labels == 0).int() * -1
    return (columns[None, :] == rows[:, None]).float()


def partner_targets(scores: torch.Tensor, min_score: float) -> torch.Tensor:
    """The clean variant: t_i,partner(i) = 1 for the rows of pairs scoring at least `min_score`, nothing else."""
    count = scores.shape[0]
    targets = torch.zeros(count, count, device=scores.device)
    positive = scores >= min_score
    rows = torch.arange(count, device=scores.device)[positive]
    targets[rows, partners(count, scores.device)[positive]] = 1.0
    return targets


def in_batch_loss(rows: torch.Tensor, targets: torch.Tensor, scale: float = IBN_SCALE) -> torch.Tensor:
    """(1/N) Σ_i Σ_j t_ij · −log softmax_j(scale · cos(r_i, r_j)) over the N rows [N, D], the diagonal excluded (as
    the official code excludes it: cosine − 1e12 before scaling, so 0 · log-probability stays finite)."""
    with torch.autocast(device_type=rows.device.type, enabled=False):
        normalised = F.normalize(rows.float(), dim=1, p=2)
        similarities = normalised @ normalised.T
        similarities = (similarities - torch.eye(rows.shape[0], device=rows.device) * MASKED) * scale
        return -(F.log_softmax(similarities, dim=1) * targets).sum(dim=1).mean()


def contrastive_loss(query: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor | None = None,
                     scale: float = IBN_SCALE) -> torch.Tensor:
    """InfoNCE of each query [B, D] against every positive (and every hard negative) of the batch, cosine × scale,
    its own positive the label (angle_emb's `contrastive_with_negative_loss`)."""
    with torch.autocast(device_type=query.device.type, enabled=False):
        target = positive if negative is None else torch.cat((positive, negative), dim=0)
        logits = F.normalize(query.float(), p=2, dim=1) @ F.normalize(target.float(), p=2, dim=1).T * scale
        return F.cross_entropy(logits, torch.arange(query.shape[0], device=query.device))
