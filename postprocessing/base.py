"""Post-processor interface: `fit(corpus_label, X)` on one corpus, then `transform(X)` of any embeddings."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from promptemb.common.errors import ConfigError


class PostProcessor(ABC):
    """A transform of `[N, D]` embeddings fitted on a named corpus ("T", "W", "stsb_train", "file:PATH", ...).

    Its `label` names it with the corpus (e.g. `quantile_u(T)`), so every score it produced says what it was fitted
    on. Transforming before fitting is a `ConfigError`. All arithmetic is float64.
    """

    #: False for transforms without statistics (normalize): they need no fit and their label has no corpus.
    fitted_from_data = True

    def __init__(self, name: str):
        self.name = name
        self.fitted_on: str | None = None
        self.corpus_size: int | None = None

    @property
    def label(self) -> str:
        return f"{self.name}({self.fitted_on})" if self.fitted_from_data else self.name

    def fit(self, corpus_label: str, embeddings: np.ndarray) -> PostProcessor:
        embeddings = np.asarray(embeddings, dtype=np.float64)
        if embeddings.ndim != 2 or len(embeddings) < 2:
            raise ConfigError(
                f"post-processor {self.name!r}: fit corpus {corpus_label!r} needs at least 2 embeddings, "
                f"got shape {embeddings.shape}"
            )
        self._fit(embeddings)
        self.fitted_on, self.corpus_size = corpus_label, len(embeddings)
        return self

    def transform(self, embeddings: np.ndarray) -> np.ndarray:
        if self.fitted_from_data and self.fitted_on is None:
            raise ConfigError(
                f"post-processor {self.name!r} was asked to transform before it was fitted; "
                "call fit(corpus_label, embeddings) first"
            )
        return self._transform(np.asarray(embeddings, dtype=np.float64))

    def _fit(self, embeddings: np.ndarray) -> None:
        return None

    @abstractmethod
    def _transform(self, embeddings: np.ndarray) -> np.ndarray: ...

    def describe(self) -> dict:
        return {"type": type(self).__name__, "fit_corpus": self.fitted_on, "fit_corpus_size": self.corpus_size,
                **self.arguments()}

    def arguments(self) -> dict:
        return {}


def centered(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean row, embeddings - mean)."""
    mean = embeddings.mean(0)
    return mean, embeddings - mean
