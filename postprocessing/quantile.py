"""Quantile transforms per dimension: to a uniform (`quantile_u`) or a standard normal (`quantile_n`) distribution."""

from __future__ import annotations

import numpy as np

from promptemb.common.errors import ConfigError
from promptemb.postprocessing.base import PostProcessor

OUTPUT_DISTRIBUTIONS = ("uniform", "normal")


class QuantileUniform(PostProcessor):
    """y_d = F̂_d(x_d) (`uniform`) or y_d = Φ⁻¹(F̂_d(x_d)) (`normal`, the quantile normalisation to a
    Gaussian of Stankevičius & Lukoševičius, 2024, "Extracting Sentence Embeddings from Pretrained Transformer
    Models"): each dimension mapped through its empirical CDF F̂_d on the fit corpus (scikit-learn's QuantileTransformer,
    `n_quantiles` = min(1000, corpus size), no subsampling; the normal output clips at scikit-learn's ±5.2σ)."""

    def __init__(self, name: str = "quantile_u", n_quantiles: int = 1000, output_distribution: str = "uniform"):
        super().__init__(name)
        if output_distribution not in OUTPUT_DISTRIBUTIONS:
            raise ConfigError(f"{name}: output_distribution {output_distribution!r} is unknown; valid: "
                              f"{', '.join(OUTPUT_DISTRIBUTIONS)}")
        self.n_quantiles = int(n_quantiles)
        self.output_distribution = output_distribution
        self.model = None

    def _fit(self, embeddings: np.ndarray) -> None:
        from sklearn.preprocessing import QuantileTransformer  # scikit-learn only when something is fitted

        self.model = QuantileTransformer(n_quantiles=min(self.n_quantiles, len(embeddings)),
                                         output_distribution=self.output_distribution, subsample=None)
        self.model.fit(embeddings)

    def _transform(self, embeddings: np.ndarray) -> np.ndarray:
        return self.model.transform(embeddings)

    def arguments(self) -> dict:
        return {"n_quantiles": self.n_quantiles, "output_distribution": self.output_distribution}
