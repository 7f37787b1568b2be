"""The AnglE objective (Li & Li, ACL 2024, Eq. 8): a weighted sum of the cosine (CoSENT), in-batch negative and angle
terms, as angle_emb 0.6.1's `AngleLoss` combines them (SeanLee97/AnglE@5155458 angle_emb/angle.py).

Pairs with scores (format A), rows in zigzag order, y each pair's gold score:

    L = w_cos · CoSENT(cos, y; τ_cos) + w_ibn · InBatch(rows, ⌊y⌋; τ_ibn) + w_angle · Angle(Δ, y; τ_angle)

Triplets (q, p, n) (format C): the in-batch terms are InfoNCE, and the ranking terms see the (q, p) pairs scored 1
and the (q, n) pairs scored 0:

    L = (w_ibn · InfoNCE(q, p) + w_cln · InfoNCE(q, [p; n])) / 2 + w_angle · Angle(...) + w_cos · CoSENT(...)

The halving is the official code's (`cll / 2`), applied whatever the two weights are, so with `w_ibn = 0` the
hard-negative term still counts half. A term with weight 0 is not computed. The defaults are angle_emb 0.6.1's
(`AngleLoss.__init__` and `angle-trainer`): w_cos 0, w_ibn 1, w_cln 1, w_angle 0.02, every τ 20, `sum` pooling of
the angle term. (Its docstring says 1.0 for w_cos and w_angle; the code's values are what runs.) The README's STS-B
example trains with w_cos 1, w_ibn 1, w_angle 0.02.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from promptemb.lightning_modules.angle import AnglePooling, angle_loss
from promptemb.lightning_modules.cosent import cosent_loss
from promptemb.lightning_modules.in_batch import (
    InBatchTargets,
    contrastive_loss,
    in_batch_loss,
    in_batch_targets,
    partner_targets,
    zigzag,
)

#: angle_emb 0.6.1's `AngleLoss` defaults (also `angle-trainer`'s command-line defaults)
ANGLE_EMB_DEFAULTS = {"cosine_w": 0.0, "ibn_w": 1.0, "cln_w": 1.0, "angle_w": 0.02, "cosine_tau": 20.0,
                      "ibn_tau": 20.0, "angle_tau": 20.0, "angle_pooling": "sum"}
#: the weights of the official README's STS-B fine-tuning example (`angle.fit(loss_kwargs=...)`)
README_STSB_WEIGHTS = {"cosine_w": 1.0, "ibn_w": 1.0, "angle_w": 0.02}


@dataclass(frozen=True)
class AnglEObjective:
    """The weights and scales of the three terms. `ibn_targets`: `angle_emb` (the official targets on scored pairs,
    `in_batch.in_batch_targets`) or `partner` (the clean variant: a row's partner, for pairs scoring at least
    `ibn_min_score`)."""

    cosine_w: float = 0.0
    ibn_w: float = 1.0
    cln_w: float = 1.0
    angle_w: float = 0.02
    cosine_tau: float = 20.0
    ibn_tau: float = 20.0
    angle_tau: float = 20.0
    angle_pooling: AnglePooling = "sum"
    ibn_targets: InBatchTargets = "angle_emb"
    ibn_min_score: float = 1.0

    def describe(self) -> dict:
        return asdict(self)

    def pairs(self, first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The loss of B scored pairs: `first`, `second` [B, D], gold `scores` [B] (angle_emb's format A)."""
        loss = first.new_zeros((), dtype=torch.float32)
        if self.cosine_w > 0:
            loss = loss + self.cosine_w * cosent_loss(first, second, scores, self.cosine_tau)
        if self.ibn_w > 0:
            row_scores = scores.repeat_interleave(2)
            targets = in_batch_targets(row_scores) if self.ibn_targets == "angle_emb" else partner_targets(
                row_scores, self.ibn_min_score)
            loss = loss + self.ibn_w * in_batch_loss(zigzag(first, second), targets, self.ibn_tau)
        if self.angle_w > 0:
            loss = loss + self.angle_w * angle_loss(first, second, scores, self.angle_tau, self.angle_pooling)
        return loss

    def triplets(self, query: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """The loss of B triplets (query, positive, hard negative), each [B, D] (angle_emb's format C)."""
        loss = query.new_zeros((), dtype=torch.float32)
        if self.ibn_w > 0 or self.cln_w > 0:
            contrastive = 0.0
            if self.ibn_w > 0:
                contrastive = contrastive + self.ibn_w * contrastive_loss(query, positive, None, self.ibn_tau)
            if self.cln_w > 0:
                contrastive = contrastive + self.cln_w * contrastive_loss(query, positive, negative, self.ibn_tau)
            loss = loss + contrastive / 2
        if self.angle_w > 0 or self.cosine_w > 0:
            first, second = torch.cat((query, query)), torch.cat((positive, negative))
            scores = torch.cat((query.new_ones(query.shape[0]), query.new_zeros(query.shape[0])))
            if self.angle_w > 0:
                loss = loss + self.angle_w * angle_loss(first, second, scores, self.angle_tau, self.angle_pooling)
            if self.cosine_w > 0:
                loss = loss + self.cosine_w * cosent_loss(first, second, scores, self.cosine_tau)
        return loss
