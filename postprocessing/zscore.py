"""Per-dimension standardisation."""

from __future__ import annotations

import numpy as np

from promptemb.postprocessing.base import PostProcessor


class ZScore(PostProcessor):
    """y_d = (x_d − μ_d) / σ_d with μ, σ (ddof 0) of the fit corpus; a constant dimension keeps σ = 1."""

    def __init__(self, name: str = "zscore"):
        super().__init__(name)

    def _fit(self, embeddings: np.ndarray) -> None:
        self.mean = embeddings.mean(0)
        std = embeddings.std(0)
        self.std = np.where(std > 0, std, 1.0)

    def _transform(self, embeddings: np.ndarray) -> np.ndarray:
        return (embeddings - self.mean) / self.std
