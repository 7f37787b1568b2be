"""Poolers whose token weights are statistics of a named corpus (e.g. idf): fitted before encoding."""

from __future__ import annotations

from collections.abc import Sequence

from promptemb.common.errors import ConfigError
from promptemb.poolers.base import Pooler


class CorpusFittedPooler(Pooler):
    """A pooler with a `fit(corpus_label, sentences, tokenizer)` step; its label carries the corpus, e.g. `idf(T)`.

    `corpus` is the label asked for in the config (None = the run's `fit_corpus`); `fitted_on` is the label of the
    corpus it was actually fitted on. Using it before `fit` is a `ConfigError`.
    """

    def __init__(self, name: str, corpus: str | None = None):
        super().__init__(name)
        self.corpus = corpus
        self.fitted_on: str | None = None
        self.corpus_size: int | None = None

    @property
    def label(self) -> str:
        return f"{self.name}({self.fitted_on or self.corpus or '?'})"

    def fit(self, corpus_label: str, sentences: Sequence[str], tokenizer) -> CorpusFittedPooler:
        if not sentences:
            raise ConfigError(f"pooler {self.name!r}: fit corpus {corpus_label!r} has no sentences")
        self._fit(list(sentences), tokenizer)
        self.fitted_on, self.corpus_size = corpus_label, len(sentences)
        return self

    def _fit(self, sentences: list[str], tokenizer) -> None:
        raise NotImplementedError

    def require_fitted(self) -> None:
        if self.fitted_on is None:
            raise ConfigError(
                f"pooler {self.name!r} was used before it was fitted; call fit(corpus_label, sentences, tokenizer) "
                "first (evaluate.py does this with fit_corpus=T|W|stsb_train|file:PATH)"
            )

    def describe(self) -> dict:
        return {**super().describe(), "fit_corpus": self.fitted_on, "fit_corpus_sentences": self.corpus_size}
