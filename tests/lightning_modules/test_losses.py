"""InfoNCE (with and without hard-negative columns) against a hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from promptemb.lightning_modules.losses import info_nce
from tests.helpers import assert_close_scaled


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
    # float64 inputs, but InfoNCE's logits are fp32: round-off to 1e-6 of their scale 1/τ = 20 (not of the loss)
    assert_close_scaled(got.item(), hand_info_nce(a, p, 0.05, n if with_negatives else None), 0.0, atol=1e-6 / 0.05)


def test_hard_negatives_only_add_columns():
    torch.manual_seed(1)
    a, p = torch.randn(4, 3), torch.randn(4, 3)
    far = -a  # cosine -1 to every anchor's own row: adds little mass at τ = 0.05
    assert info_nce(a, p, 0.05, far).item() >= info_nce(a, p, 0.05).item()


def bf16_autocast_path_before_the_fix(anchors, positives, temperature):
    """The counter-example: normalisation and similarities left to autocast (bf16), only the softmax in fp32."""
    logits = F.normalize(anchors, dim=-1) @ F.normalize(positives, dim=-1).T / temperature
    return F.cross_entropy(logits.float(), torch.arange(anchors.shape[0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_autocast_gives_the_fp32_loss(seed):
    """Anisotropic embeddings (a shared direction, as BERT's) and a near-converged loss (≈0.14), where logits sit
    near 1/τ = 20 and bf16 rounds them in steps of 0.125: the loss computed under bf16 autocast must stay within 1e-2
    relative of the fp32 loss; the bf16 similarity path misses by more."""
    torch.manual_seed(seed)
    projection = torch.nn.Linear(768, 768)
    sentences = torch.randn(64, 768) + 1.5 * torch.randn(1, 768)
    views = (sentences, sentences + 0.3 * torch.randn_like(sentences))
    reference = info_nce(*(projection(v) for v in views)).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        anchors, positives = (projection(v) for v in views)
        assert anchors.dtype == torch.bfloat16
        got = info_nce(anchors, positives).item()
        old = bf16_autocast_path_before_the_fix(anchors, positives, 0.05).item()
    assert got == pytest.approx(reference, rel=1e-3)
    assert abs(old - reference) > 1e-2 * reference
