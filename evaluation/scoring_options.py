"""What every family's scorer (STS, transfer, clustering) is told besides the tasks and poolers: the input form
(template, sentence rule, sentence truncation), the post-processors scored as extra rows, with the corpus they
(and idf) are fitted on, and the Matryoshka widths each pooler is also scored at (`pooler@d` rows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from promptemb.common.errors import ConfigError
from promptemb.data.fit_corpora import TARGET, Corpora
from promptemb.data.tasks import TaskSpec
from promptemb.encoder.template import Template
from promptemb.postprocessing.base import PostProcessor


@dataclass(frozen=True)
class ScoringOptions:
    template: Template | None = None
    sentence_rule: str = "none"
    max_sentence_tokens: int | None = None
    posts: Sequence[PostProcessor] = ()
    fit_corpus: str = TARGET
    corpora: Corpora | None = None  # None: the corpora of the scored tasks under the data root
    dims: tuple[int, ...] = ()  # also score each pooler's first d components (`pooler@d`), d below its width

    def corpora_for(self, root: Path, tasks: Sequence[TaskSpec]) -> Corpora:
        return self.corpora or Corpora(root, {spec.name: spec for spec in tasks})


def check_dims(dims, width: int, key: str = "dims") -> None:
    """Matryoshka evaluation widths: each an integer from 1 to the embedding width, none twice (one line each)."""
    dims = list(dims or ())
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(f"{key}={dims}: every width must be an integer >= 1")
    if len(set(dims)) != len(dims):
        raise ConfigError(f"{key}={dims} lists a width twice; list each once")
    if width and (too_wide := [d for d in dims if d > width]):
        raise ConfigError(f"{key}={dims}: {too_wide[0]} is wider than the model's {width}-dimensional embeddings; "
                          f"use widths <= {width}")


#: plain sentences, no post-processors
DEFAULT_OPTIONS = ScoringOptions()
