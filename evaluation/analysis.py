"""Geometry of an embedding set: anisotropy, alignment and uniformity (Wang & Isola, 2020), IsoScore (Rudman et al.,
2022). `analyse_task` computes them for one task's embeddings, seeded, for `evaluate.py analysis=true`."""

from __future__ import annotations

import numpy as np

from promptemb.evaluation.pooler_variants import task_rows

#: Pairs whose gold similarity is at least this (0-5 STS scale; SICK 1-5) count as positives for alignment.
POSITIVE_GOLD = 4.0


def unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def random_pairs(count: int, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` random pairs (i, j), i != j, of `rows` items."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, rows, count)
    second = (first + rng.integers(1, rows, count)) % rows
    return first, second


def anisotropy(x: np.ndarray, first: np.ndarray, second: np.ndarray) -> float:
    """Mean cosine similarity of random pairs (0 = isotropic directions, 1 = all in one direction)."""
    return float((unit(x[first]) * unit(x[second])).sum(-1).mean())


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """E ‖f(x) − f(y)‖^α over positive pairs, f = unit-normalised embedding (lower is better)."""
    return float((np.linalg.norm(unit(x) - unit(y), axis=-1) ** alpha).mean())


def uniformity(x: np.ndarray, first: np.ndarray, second: np.ndarray, t: float = 2.0) -> float:
    """log E exp(−t ‖f(x) − f(y)‖²) over random pairs of unit-normalised embeddings (lower is more uniform)."""
    distances = (np.linalg.norm(unit(x[first]) - unit(x[second]), axis=-1)) ** 2
    return float(np.log(np.exp(-t * distances).mean()))


def isoscore(x: np.ndarray) -> float:
    """IsoScore ι ∈ [0, 1]: 1 = variance spread evenly over all n dimensions, 0 = all in one.

    σ = variances along the principal axes (PCA reorientation); σ̂ = √n·σ/‖σ‖; δ = ‖σ̂ − 1‖ / √(2(n − √n));
    φ = (n − δ²(n − √n))² / n²; ι = (nφ − 1) / (n − 1).
    """
    centered = x - x.mean(0)
    variances = np.clip(np.linalg.eigvalsh(centered.T @ centered / len(x)), 0.0, None)
    n = x.shape[1]
    scaled = np.sqrt(n) * variances / np.linalg.norm(variances)
    delta = np.linalg.norm(scaled - 1.0) / np.sqrt(2 * (n - np.sqrt(n)))
    phi = (n - delta**2 * (n - np.sqrt(n))) ** 2 / n**2
    return float((n * phi - 1) / (n - 1))


def analyse_task(task, embeddings: np.ndarray, pairs: int = 2000, seed: int = 0) -> dict:
    """Metrics of one task's sentence embeddings (rows of `embeddings` used by the task)."""
    rows = task_rows(task)
    x = embeddings[rows]
    first, second = random_pairs(pairs, len(rows), seed)
    positive = task.pairs.gold_array() >= POSITIVE_GOLD
    return {
        "anisotropy": anisotropy(x, first, second),
        "alignment": alignment(embeddings[task.left[positive]], embeddings[task.right[positive]])
        if positive.any() else None,
        "uniformity": uniformity(x, first, second),
        "isoscore": isoscore(x),
        "positive_pairs": int(positive.sum()),
    }
