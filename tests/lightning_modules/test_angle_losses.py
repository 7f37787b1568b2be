"""AnglE's terms and their combination against the official numbers: angle-emb 0.6.1's losses and gradients, computed
in a side environment by tests/lightning_modules/angle_official_references.py and kept in angle_emb_0.6.1.json
(repository commit and sha256 of the official files recorded in it), and sentence-transformers' `CoSENTLoss` and
`AnglELoss`, called here.

Tolerance: max |ours − official| ≤ 1e-4 × max |official| for every loss and every gradient tensor (float32 on both
sides; the same bar as the decoder methods)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sentence_transformers.sentence_transformer.losses import AnglELoss, CoSENTLoss

from promptemb.lightning_modules.angle import angle_difference, angle_loss
from promptemb.lightning_modules.angle_objective import ANGLE_EMB_DEFAULTS, README_STSB_WEIGHTS, AnglEObjective
from promptemb.lightning_modules.cosent import cosent_loss
from promptemb.lightning_modules.in_batch import in_batch_loss, in_batch_targets, partner_targets, partners, zigzag

REFERENCE = json.loads((Path(__file__).with_name("angle_emb_0.6.1.json")).read_text())
RELATIVE = 1e-4


def close(ours: torch.Tensor, official, what: str) -> None:
    official = torch.tensor(official, dtype=torch.float64)
    scale = float(official.abs().max())
    error = float((ours.detach().double() - official).abs().max())
    assert error <= RELATIVE * max(scale, 1e-12), f"{what}: max error {error:.3g} > {RELATIVE} x {scale:.3g}"


def split(outputs: torch.Tensor, every: int) -> list[torch.Tensor]:
    """The official layout's rows [x_0, y_0, (z_0,) x_1, ...] -> x, y(, z), each a leaf."""
    return [outputs[k::every].detach().clone().requires_grad_(True) for k in range(every)]


def regrouped(grads: list[torch.Tensor]) -> torch.Tensor:
    """Gradients of x, y(, z) back in the official row layout."""
    return torch.stack(grads, dim=1).reshape(-1, grads[0].shape[-1])


#: each official pair case -> our computation of it from (first, second, scores)
PAIR_TERMS = {
    "cosine_loss": lambda a, b, y: cosent_loss(a, b, y, 20.0),
    "in_batch_negative_loss": lambda a, b, y: in_batch_loss(zigzag(a, b), in_batch_targets(y.repeat_interleave(2)),
                                                            20.0),
    "angle_loss_sum": lambda a, b, y: angle_loss(a, b, y, 20.0, "sum"),
    "angle_loss_mean": lambda a, b, y: angle_loss(a, b, y, 20.0, "mean"),
    "AngleLoss_defaults": lambda a, b, y: AnglEObjective().pairs(a, b, y),
    "AngleLoss_readme_stsb": lambda a, b, y: AnglEObjective(**README_STSB_WEIGHTS).pairs(a, b, y),
    "AngleLoss_tau_5": lambda a, b, y: AnglEObjective(cosine_w=0.5, ibn_w=2.0, angle_w=0.3, cosine_tau=5.0,
                                                      ibn_tau=10.0, angle_tau=5.0).pairs(a, b, y),
}
TRIPLET_SETTINGS = {"AngleLoss_defaults": {}, "AngleLoss_cosine_on": {"cosine_w": 1.0},
                    "AngleLoss_ibn_off": {"ibn_w": 0.0}, "AngleLoss_mean_pooling": {"angle_pooling": "mean"},
                    "AngleLoss_other_weights": {"ibn_w": 0.5, "cln_w": 2.0, "angle_w": 1.0, "cosine_w": 0.25,
                                                "ibn_tau": 10.0, "angle_tau": 5.0, "cosine_tau": 40.0}}


def test_the_reference_file_names_its_source():
    assert REFERENCE["angle_emb"] == "0.6.1" and REFERENCE["dtype"] == "float32"
    assert REFERENCE["repository_commit"] == "5155458cfa6f7fbc7a8a19a66960cd86eadfd534"
    assert REFERENCE["sha256"]["loss.py"] == "898b02492a3d0dbda2c2702b55f6fa64f5b78e32142c2d49b5a6024103e481fd"


def test_the_defaults_are_angle_emb_0_6_1s():
    official = dict(REFERENCE["defaults"])
    official["angle_pooling"] = official.pop("angle_pooling_strategy")
    assert official == ANGLE_EMB_DEFAULTS
    ours = AnglEObjective().describe()
    assert {key: ours[key] for key in ANGLE_EMB_DEFAULTS} == ANGLE_EMB_DEFAULTS


@pytest.mark.parametrize("case", range(len(REFERENCE["pairs"])))
@pytest.mark.parametrize("term", sorted(PAIR_TERMS))
def test_pair_losses_and_gradients_equal_angle_emb(case, term):
    data = REFERENCE["pairs"][case]
    outputs = torch.tensor(data["outputs"], dtype=torch.float32)
    scores = torch.tensor(data["labels"][::2], dtype=torch.float32)
    first, second = split(outputs, 2)
    loss = PAIR_TERMS[term](first, second, scores)
    loss.backward()
    official = data["results"][term]
    close(loss, official["loss"], f"case {case} {term} loss")
    close(regrouped([first.grad, second.grad]), official["grads"][0], f"case {case} {term} gradient")


@pytest.mark.parametrize("case", range(len(REFERENCE["triplets"])))
@pytest.mark.parametrize("setting", sorted(TRIPLET_SETTINGS))
def test_triplet_losses_and_gradients_equal_angle_emb(case, setting):
    data = REFERENCE["triplets"][case]
    query, positive, negative = split(torch.tensor(data["outputs"], dtype=torch.float32), 3)
    loss = AnglEObjective(**TRIPLET_SETTINGS[setting]).triplets(query, positive, negative)
    loss.backward()
    official = data["results"][setting]
    close(loss, official["loss"], f"case {case} {setting} loss")
    close(regrouped([query.grad, positive.grad, negative.grad]), official["grads"][0],
          f"case {case} {setting} gradient")


def test_the_cases_exercise_the_official_in_batch_targets():
    """The graded cases hold pairs with 0 < y < 1 (no target), and index collisions (extra targets), so the
    equality above covers both surprises; the clean variant differs from the official exactly there."""
    scores = torch.tensor(REFERENCE["pairs"][1]["labels"])
    official, clean = in_batch_targets(scores), partner_targets(scores, 1.0)
    assert ((scores > 0) & (scores < 1)).any()
    extra = official - clean
    assert (extra >= 0).all() and extra.sum() > 0  # collisions only add targets
    assert torch.equal(clean.sum(dim=1), (scores >= 1).float())
    rows = torch.arange(scores.shape[0])
    assert torch.equal(official[rows, partners(scores.shape[0])], (scores >= 1).float())


def test_clean_in_batch_targets_equal_the_official_without_collisions():
    """0/1 labels on 4 pairs: no index product collides, so both target sets are the partners of the positive pairs."""
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0]).repeat_interleave(2)
    assert torch.equal(in_batch_targets(scores), partner_targets(scores, 1.0))


def test_collator_layout_is_the_zigzag_the_losses_read():
    """The official collator lays a batch of pairs out as [text1_0, text2_0, text1_1, ...] with each pair's label on
    both rows, and triplets as [query_0, positive_0, negative_0, ...]: the layouts `zigzag` and `split` use."""
    layout = REFERENCE["collator"]
    assert layout["pairs"]["rows"] == ["a", "b", "c", "d", "e", "f"]
    assert layout["pairs"]["labels"] == pytest.approx([4.6, 4.6, 0.5, 0.5, 2.0, 2.0])
    assert layout["triplets"]["rows"] == ["a", "b", "c", "d", "e", "f"]
    first, second = torch.tensor([[1.0], [3.0]]), torch.tensor([[2.0], [4.0]])
    assert zigzag(first, second)[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    # filter_duplicate (on in `AnglE.fit`, off in `angle-trainer`) drops a pair repeating an earlier text, and the
    # dropped pair's first text still blocks later pairs: ("c", "d") goes too (not reproduced: see docs/training.md)
    assert layout["duplicates_filtered"]["rows"] == ["a", "b", "e", "f"]
    assert layout["duplicates_kept"]["rows"] == ["a", "b", "c", "a", "c", "d", "e", "f"]


# ---- sentence-transformers, called directly ------------------------------------------------------------------------

def st_embeddings(seed: int, pairs: int, width: int):
    generator = torch.Generator().manual_seed(seed)
    first, second = (torch.randn(pairs, width, generator=generator).requires_grad_(True) for _ in range(2))
    scores = torch.tensor([0.0, 0.4, 1.0, 2.5, 2.5, 3.8, 5.0, 4.2, 1.2, 3.3, 0.0, 4.9][:pairs])
    return first, second, scores


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scale", [20.0, 7.5])
def test_cosine_and_angle_terms_equal_sentence_transformers(seed, scale):
    for ours_fn, theirs_cls in [(cosent_loss, CoSENTLoss), (angle_loss, AnglELoss)]:
        first, second, scores = st_embeddings(seed, 12, 16)
        ours = ours_fn(first, second, scores, scale)
        ours_grads = torch.autograd.grad(ours, (first, second))
        theirs = theirs_cls(model=None, scale=scale).compute_loss_from_embeddings([first, second], scores)
        theirs_grads = torch.autograd.grad(theirs, (first, second))
        close(ours, float(theirs), f"{theirs_cls.__name__} loss")
        for mine, reference in zip(ours_grads, theirs_grads, strict=True):
            close(mine, reference.tolist(), f"{theirs_cls.__name__} gradient")


def test_triplet_angle_term_equals_sentence_transformers_anglelosss_triplets():
    """`AnglELoss` on (anchor, positive, negative) scores the (anchor, positive) pairs 1 and (anchor, negative) 0,
    as the official format C angle term does."""
    generator = torch.Generator().manual_seed(5)
    query, positive, negative = (torch.randn(6, 8, generator=generator).requires_grad_(True) for _ in range(3))
    ours = AnglEObjective(ibn_w=0.0, cln_w=0.0, angle_w=1.0).triplets(query, positive, negative)
    theirs = AnglELoss(model=None).compute_loss_from_embeddings([query, positive, negative], None)
    close(ours, float(theirs), "loss")
    for mine, reference in zip(torch.autograd.grad(ours, (query, positive, negative)),
                               torch.autograd.grad(theirs, (query, positive, negative)), strict=True):
        close(mine, reference.tolist(), "gradient")


def test_only_the_order_of_the_scores_matters_to_the_ranking_terms():
    first, second, scores = st_embeddings(2, 12, 16)
    for term in (cosent_loss, angle_loss):
        assert float(term(first, second, scores)) == pytest.approx(float(term(first, second, scores / 5 + 3)))


def test_angle_difference_refuses_an_odd_width():
    with pytest.raises(ValueError, match="width 7 is odd"):
        angle_difference(torch.randn(2, 7), torch.randn(2, 7))


def test_bf16_autocast_computes_the_terms_in_float32():
    first, second, scores = st_embeddings(3, 12, 16)
    reference = AnglEObjective(**README_STSB_WEIGHTS).pairs(first, second, scores)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = AnglEObjective(**README_STSB_WEIGHTS).pairs(first.bfloat16(), second.bfloat16(), scores)
    assert under.dtype == torch.float32
    assert float(under) == pytest.approx(float(reference), rel=2e-2)
