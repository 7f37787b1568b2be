"""Whitening (BERT-whitening, Su et al. 2021, Eq. 5-7), optionally keeping the top-k dimensions."""

from __future__ import annotations

import numpy as np

from promptemb.common.errors import ConfigError
from promptemb.postprocessing.base import PostProcessor, centered


class Whiten(PostProcessor):
    """y = (x − μ) · U_k Λ_k^{-1/2}, where Σ = (X−μ)ᵀ(X−μ)/N = U Λ Uᵀ on the fit corpus (SVD, eigenvalues
    descending) and k = `k` leading directions (None = all). Eigenvalues below `eps` are clamped to `eps`."""

    def __init__(self, name: str = "whiten", k: int | None = None, eps: float = 1e-12):
        super().__init__(name)
        if k is not None and k < 1:
            raise ConfigError(f"whiten k must be >= 1 or null, got {k}")
        self.k, self.eps = k, eps

    def _fit(self, embeddings: np.ndarray) -> None:
        self.mean, x = centered(embeddings)
        u, s, _ = np.linalg.svd(x.T @ x / len(x))
        k = self.k or len(s)
        self.matrix = u[:, :k] / np.sqrt(np.maximum(s[:k], self.eps))

    def _transform(self, embeddings: np.ndarray) -> np.ndarray:
        return (embeddings - self.mean) @ self.matrix

    def arguments(self) -> dict:
        return {"k": self.k}
