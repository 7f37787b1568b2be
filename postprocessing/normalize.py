"""Unit-norm rows."""

from __future__ import annotations

import numpy as np

from promptemb.postprocessing.base import PostProcessor


class Normalize(PostProcessor):
    """y = x / ‖x‖ (a zero row stays zero). No statistics: needs no fit, and its label names no corpus."""

    fitted_from_data = False

    def __init__(self, name: str = "normalize"):
        super().__init__(name)

    def _transform(self, embeddings: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        return embeddings / np.where(norms > 0, norms, 1.0)
