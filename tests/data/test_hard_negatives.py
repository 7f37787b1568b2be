"""Hard-negative mining selects exactly the negatives sentence-transformers' `util.mine_hard_negatives` selects, from
the same embeddings and settings (a stand-in model hands both the same vectors; `exclude_anchor` as the installed
release does it): on SICK-train pairs embedded by MiniLM, and on random vectors with exact ties and repeated texts;
bad settings are refused in one line."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import sentence_transformers
import torch
import torch.nn.functional as F
from datasets import Dataset
from packaging.version import Version
from sentence_transformers.util import cos_sim, pairwise_cos_sim
from sentence_transformers.util import mine_hard_negatives as st_mine_hard_negatives

from promptemb.common.errors import ConfigError
from promptemb.data.hard_negatives import MiningSettings, mine_hard_negatives, settings_record
from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler
from tests.helpers import MINILM

#: sentence-transformers 6.3 took the anchor's own text out of its candidates (our `exclude_anchor=True`, the
#: default); before 6.3 it stayed a candidate (`exclude_anchor=False`). The reference is whichever is installed.
ST_EXCLUDES_ANCHOR = Version(sentence_transformers.__version__) >= Version("6.3")


class FixedEmbeddings:
    """What `mine_hard_negatives` calls on a SentenceTransformer, answering from a table of vectors: its encode
    normalises (normalize_embeddings=True), its similarities are the default cosine."""

    device = torch.device("cpu")

    def __init__(self, table: dict[str, np.ndarray]):
        self.table = table

    def encode_document(self, texts, normalize_embeddings=False, **_):
        rows = torch.as_tensor(np.stack([self.table[text] for text in texts]), dtype=torch.float32)
        return (F.normalize(rows, p=2, dim=1) if normalize_embeddings else rows).numpy()

    encode_query = encode_document

    @staticmethod
    def similarity(a, b):
        return cos_sim(a, b)

    @staticmethod
    def similarity_pairwise(a, b):
        return pairwise_cos_sim(a, b)


def reference(pairs, table, settings: MiningSettings, corpus=None) -> list[tuple[str, str, str, float, float]]:
    """sentence-transformers' triplets (with their [positive, negative] scores); "random" draws after seeding
    Python's global generator with the settings' seed, as a user of its function does."""
    options = {key: value for key, value in vars(settings).items() if key not in ("seed", "exclude_anchor")}
    random.seed(settings.seed)
    dataset = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
    out = st_mine_hard_negatives(dataset, FixedEmbeddings(table), corpus=corpus, output_format="triplet",
                                 output_scores=True, verbose=False, **options)
    return [(row["anchor"], row["positive"], row["negative"], *row["scores"]) for row in out]


def ours(pairs, table, settings: MiningSettings, corpus=None):
    mined = mine_hard_negatives(pairs, lambda texts: np.stack([table[t] for t in texts]), settings, corpus)
    return [(*triplet, p, n) for triplet, p, n in zip(mined.triplets, mined.positive_scores, mined.negative_scores,
                                                       strict=True)]


def assert_same_selection(got, expected):
    assert [row[:3] for row in got] == [row[:3] for row in expected]
    np.testing.assert_allclose([row[3:] for row in got], [row[3:] for row in expected], atol=1e-6)
    assert got  # something was mined


SETTINGS = [
    {},
    {"absolute_margin": 0.0},
    {"relative_margin": 0.05, "num_negatives": 5},
    {"range_min": 3, "range_max": 25, "max_score": 0.9, "min_score": 0.3},
    {"absolute_margin": 0.1, "relative_margin": 0.1, "num_negatives": 2, "max_score": 0.8},
    {"sampling_strategy": "random", "num_negatives": 4, "seed": 7},
    {"sampling_strategy": "random", "range_min": 5, "range_max": 40, "absolute_margin": 0.02, "seed": 2026},
]


@pytest.fixture(scope="module")
def sick_pairs(real_data_root):
    """(premise, entailed) pairs of the first 400 SICK-train rows, repeats kept, and MiniLM mean embeddings of
    every text (plus the contradictions, an extra corpus)."""
    lines = (real_data_root / "downstream/SICK/SICK_train.txt").read_text(encoding="utf-8").splitlines()[1:401]
    rows = [line.split("\t") for line in lines]
    pairs = [(r[1], r[2]) for r in rows if r[4] == "ENTAILMENT"]
    pairs += [(r[2], r[1]) for r in rows[:60] if r[4] == "ENTAILMENT"]  # anchors that are also positives elsewhere
    pairs += pairs[:5]  # repeated rows
    corpus = [r[2] for r in rows if r[4] == "CONTRADICTION"]
    texts = sorted({t for pair in pairs for t in pair} | set(corpus))
    embeddings = Encoder(MINILM, progress=False).embed(texts, [build_pooler("mean")])["mean"]
    return pairs, dict(zip(texts, embeddings, strict=True)), corpus


@pytest.mark.parametrize("options", SETTINGS)
@pytest.mark.parametrize("with_corpus", [False, True])
def test_same_negatives_as_sentence_transformers_on_sick_minilm(sick_pairs, options, with_corpus):
    pairs, table, corpus = sick_pairs
    settings = MiningSettings(exclude_anchor=ST_EXCLUDES_ANCHOR, **options)
    extra = corpus if with_corpus else None
    assert_same_selection(ours(pairs, table, settings, extra), reference(pairs, table, settings, extra))


@pytest.mark.parametrize("options", SETTINGS)
def test_same_negatives_with_ties_and_repeated_texts(options):
    """Random vectors, several texts sharing one vector (exact score ties), a corpus smaller than the window
    (padded columns), anchors with several positives, repeated rows."""
    generator = np.random.default_rng(0)
    vectors = generator.normal(size=(12, 8)).astype(np.float32)
    texts = [f"text {i}" for i in range(30)]
    table = {text: vectors[i % 12] * (1 + i // 12) for i, text in enumerate(texts)}  # same direction, other scale
    pairs = [(texts[i], texts[(3 * i + 1) % 30]) for i in range(20)] + [(texts[2], texts[9]), (texts[2], texts[9]),
                                                                         (texts[4], texts[5])]
    settings = MiningSettings(exclude_anchor=ST_EXCLUDES_ANCHOR, **options)
    if settings.range_max is not None and settings.range_max > 20:
        settings = MiningSettings(**{**vars(settings), "range_max": 20})
    assert_same_selection(ours(pairs, table, settings), reference(pairs, table, settings))


def test_exclude_anchor_removes_only_the_anchor_text(sick_pairs):
    """The default keeps the anchor's own text out of its candidates; otherwise the same ranking."""
    pairs, table, _ = sick_pairs
    plain = ours(pairs, table, MiningSettings(exclude_anchor=False, num_negatives=3))
    excluded = ours(pairs, table, MiningSettings(num_negatives=3))
    assert any(anchor == negative for anchor, _, negative, *_ in plain)  # the case it exists for
    assert not any(anchor == negative for anchor, _, negative, *_ in excluded)
    kept = {(a, p): [n for a2, p2, n, *_ in plain if (a2, p2) == (a, p) and n != a] for a, p in pairs}
    for (a, p), negatives in kept.items():
        mine = [n for a2, p2, n, *_ in excluded if (a2, p2) == (a, p)]
        assert mine[:len(negatives)] == negatives  # the anchor's slot goes to the next candidate


@pytest.mark.parametrize(("options", "message"), [
    ({"absolute_margin": -0.1}, "absolute_margin=-0.1 is out of range: absolute_margin is a cosine difference, "
                                "from 0 to 2"),
    ({"relative_margin": 1.5}, "relative_margin=1.5 is out of range"),
    ({"relative_margin": -0.05}, "relative_margin=-0.05 is out of range"),
    ({"max_score": 1.2}, "max_score=1.2 is out of range: max_score is a cosine, from -1 to 1"),
    ({"min_score": 0.8, "max_score": 0.5}, "min_score=0.8 >= max_score=0.5 leaves no candidate"),
    ({"range_min": -1}, "range_min=-1: must be an integer >= 0"),
    ({"range_min": 10, "range_max": 10}, "range_max=10 must be an integer > range_min=10"),
    ({"range_min": 8, "range_max": 10, "num_negatives": 3}, "cannot mine num_negatives=3 per anchor: range_min=8 "
                                                            "and range_max=10 leave 2 candidates"),
    ({"num_negatives": 0}, "num_negatives=0: must be an integer >= 1"),
    ({"sampling_strategy": "hardest"}, "sampling_strategy='hardest'; valid: top, random"),
])
def test_settings_out_of_range_are_refused(options, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        MiningSettings(**options)


def test_the_record_names_the_releases_it_equals():
    assert settings_record(MiningSettings(), 7)["equals"] == "sentence-transformers>=6.3 util.mine_hard_negatives"
    assert settings_record(MiningSettings(exclude_anchor=False), 7)["equals"] == (
        "sentence-transformers<6.3 util.mine_hard_negatives")
