"""InfoNCE (with and without hard-negative columns) against a hand computation."""

import math

import pytest
import torch

from lightning_modules.losses import info_nce


def hand_info_nce(anchors, positives, temperature, negatives=None):
    total = 0.0
    columns = list(positives) + (list(negatives) if negatives is not None else [])
    for i, a in enumerate(anchors):
        def cos(u, v):
            return float(u @ v) / (float(u.norm()) * float(v.norm()))
        numerator = math.exp(cos(a, positives[i]) / temperature)
        denominator = sum(math.exp(cos(a, c) / temperature) for c in columns)
        total += -math.log(numerator / denominator)
    return total / len(anchors)


@pytest.mark.parametrize("with_negatives", [False, True])
def test_info_nce_matches_hand_computation(with_negatives):
    torch.manual_seed(0)
    a, p, n = (torch.randn(5, 7, dtype=torch.float64) for _ in range(3))
    got = info_nce(a, p, 0.05, n if with_negatives else None)
    assert got.item() == pytest.approx(hand_info_nce(a, p, 0.05, n if with_negatives else None), rel=1e-6)


def test_hard_negatives_only_add_columns():
    torch.manual_seed(1)
    a, p = torch.randn(4, 3), torch.randn(4, 3)
    far = -a  # cosine -1 to every anchor's own row: adds little mass at τ = 0.05
    assert info_nce(a, p, 0.05, far).item() >= info_nce(a, p, 0.05).item()
