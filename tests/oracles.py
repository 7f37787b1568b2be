"""Plain per-token loop re-computations used as oracles by the tests and bench/ (never by library code)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics.pairwise import cosine_similarity
from sklearn.preprocessing import normalize


def sbert_wk_token_loop(token_feature: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """One token, [K, D] layer features -> (unified vector [D], alpha [K]); numpy QR per layer, as described in
    the reference implementation (left window [k-m, k) via Python slicing, right window (k, k+m], then layer k)."""
    num_layers = token_feature.shape[0]
    alignment, novelty = np.zeros(num_layers), np.zeros(num_layers)
    for k in range(num_layers):
        left = token_feature[k - window : k, :]
        right = token_feature[k + 1 : k + window + 1, :]
        matrix = np.vstack([left, right, token_feature[k, :][None, :]])
        _, big_r = np.linalg.qr(matrix.T)
        r = big_r[:, -1]
        alignment[k] = np.mean(normalize(big_r[:-1, :-1], axis=0), axis=1).dot(big_r[:-1, -1]) / np.linalg.norm(r[:-1])
        alignment[k] = 1 / (alignment[k] * matrix.shape[0] * 2)
        novelty[k] = abs(r[-1]) / np.linalg.norm(r)
    alpha = alignment / alignment.sum() + novelty / novelty.sum()
    alpha = alpha / alpha.sum()
    return token_feature.T.dot(alpha), alpha


def sbert_wk_sentence_loop(sentence_feature: np.ndarray, window: int) -> np.ndarray:
    """One sentence, [K, T, D] (T = the tokens that take part) -> [D]."""
    unified = np.array([sbert_wk_token_loop(sentence_feature[:, t, :], window)[0]
                        for t in range(sentence_feature.shape[1])])
    variance = np.zeros(unified.shape[0])
    for t in range(unified.shape[0]):
        variance[t] = np.var(cosine_similarity(sentence_feature[:, t, :]).diagonal(-1))
    variance = variance / variance.sum()
    return unified.T.dot(variance)
