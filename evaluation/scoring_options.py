"""What every family's scorer (STS, transfer, clustering) is told besides the tasks and poolers: the input form
(template, sentence rule, sentence truncation) and the post-processors scored as extra rows, with the corpus they
(and idf) are fitted on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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

    def corpora_for(self, root: Path, tasks: Sequence[TaskSpec]) -> Corpora:
        return self.corpora or Corpora(root, {spec.name: spec for spec in tasks})


#: plain sentences, no post-processors
DEFAULT_OPTIONS = ScoringOptions()
