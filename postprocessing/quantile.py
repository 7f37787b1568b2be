"""Uniform quantile transform per dimension."""

from __future__ import annotations

import numpy as np
from sklearn.preprocessing import QuantileTransformer

from postprocessing.base import PostProcessor


class QuantileUniform(PostProcessor):
    """y_d = F̂_d(x_d): each dimension mapped through its empirical CDF on the fit corpus (scikit-learn's
    QuantileTransformer, uniform output, `n_quantiles` = min(1000, corpus size), no subsampling)."""

    def __init__(self, name: str = "quantile_u", n_quantiles: int = 1000):
        super().__init__(name)
        self.n_quantiles = int(n_quantiles)
        self.model: QuantileTransformer | None = None

    def _fit(self, embeddings: np.ndarray) -> None:
        self.model = QuantileTransformer(n_quantiles=min(self.n_quantiles, len(embeddings)),
                                         output_distribution="uniform", subsample=None)
        self.model.fit(embeddings)

    def _transform(self, embeddings: np.ndarray) -> np.ndarray:
        return self.model.transform(embeddings)

    def arguments(self) -> dict:
        return {"n_quantiles": self.n_quantiles}
