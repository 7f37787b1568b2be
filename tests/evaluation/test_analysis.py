"""Geometry metrics against closed forms and plain loops."""

import math

import numpy as np
import pytest

from promptemb.evaluation.analysis import alignment, anisotropy, isoscore, random_pairs, uniformity


def test_isoscore_extremes_and_rotation_invariance():
    rng = np.random.default_rng(0)
    isotropic = rng.normal(size=(20000, 5))
    assert isoscore(isotropic) == pytest.approx(1.0, abs=0.01)
    line = np.outer(rng.normal(size=500), rng.normal(size=5))
    assert isoscore(line) == pytest.approx(0.0, abs=1e-9)
    skewed = rng.normal(size=(3000, 5)) * np.array([5.0, 1, 1, 0.5, 0.1])
    rotation, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    assert isoscore(skewed @ rotation) == pytest.approx(isoscore(skewed), abs=1e-9)
    assert 0.0 < isoscore(skewed) < 1.0


def test_pair_metrics_equal_loops():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 4)), rng.normal(size=(30, 4))
    first, second = random_pairs(200, 30, seed=3)
    assert (first != second).all()

    def unit(v):
        return v / math.sqrt(sum(c * c for c in v))

    cosines = [float(unit(x[i]) @ unit(x[j])) for i, j in zip(first, second)]
    assert anisotropy(x, first, second) == pytest.approx(sum(cosines) / len(cosines))
    distances = [sum((a - b) ** 2 for a, b in zip(unit(x[i]), unit(y[i]))) for i in range(30)]
    assert alignment(x, y) == pytest.approx(sum(distances) / 30)
    sq = [sum((a - b) ** 2 for a, b in zip(unit(x[i]), unit(x[j]))) for i, j in zip(first, second)]
    assert uniformity(x, first, second) == pytest.approx(math.log(sum(math.exp(-2 * d) for d in sq) / len(sq)))
