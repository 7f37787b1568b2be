"""All-but-the-top (Mu & Viswanath, 2018, Algorithm 1)."""

from __future__ import annotations

import numpy as np

from promptemb.common.errors import ConfigError
from promptemb.postprocessing.base import PostProcessor, centered


class AllButTheTop(PostProcessor):
    """y = x̃ − Σ_{i≤k} (u_iᵀ x̃) u_i with x̃ = x − μ; μ and the top-k principal directions u_i of the fit corpus.
    `k` = None uses the paper's rule of thumb D/100 (at least 1)."""

    def __init__(self, name: str = "abtt", k: int | None = None):
        super().__init__(name)
        if k is not None and k < 1:
            raise ConfigError(f"abtt k must be >= 1 or null, got {k}")
        self.k = k

    def _fit(self, embeddings: np.ndarray) -> None:
        self.mean, x = centered(embeddings)
        self.k_used = self.k or max(1, embeddings.shape[1] // 100)
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        self.directions = vt[: self.k_used]  # [k, D], rows = principal directions

    def _transform(self, embeddings: np.ndarray) -> np.ndarray:
        x = embeddings - self.mean
        return x - (x @ self.directions.T) @ self.directions

    def arguments(self) -> dict:
        return {"k": self.k, "k_used": getattr(self, "k_used", None)}
