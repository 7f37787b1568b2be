"""The one encoder pass every evaluation family scores from: the unique sentences of its tasks (`SentenceIndex`),
each encoded once per input form for all poolers at once (`encode_plans`), the truncation counts of that pass, and
the checks that run before it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from promptemb.data.fit_corpora import TARGET, Corpora
from promptemb.encoder.model import Encoder, Truncation
from promptemb.encoder.template import Template
from promptemb.evaluation.fitting import load_fit_corpora, plan_poolers
from promptemb.evaluation.pooler_variants import PooledEmbeddings, task_rows
from promptemb.evaluation.scoring_options import ScoringOptions, check_dims
from promptemb.poolers.base import Pooler

log = logging.getLogger(__name__)
#: truncation counts already reported in this process (the training callback scores STS-B dev again and again)
_REPORTED_TRUNCATION: set[tuple] = set()


@dataclass
class SentenceIndex:
    """The unique sentences of several tasks, so each is encoded once; tasks refer to rows by index."""

    sentences: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)

    def add(self, sentences: Sequence[str]) -> np.ndarray:
        ids = []
        for sentence in sentences:
            if sentence not in self.rows:
                self.rows[sentence] = len(self.sentences)
                self.sentences.append(sentence)
            ids.append(self.rows[sentence])
        return np.asarray(ids, dtype=np.int64)


def check_scoring(encoder: Encoder, poolers: Sequence[Pooler], template: Template | None, has_posts: bool,
                  fit_corpus: str, corpora: Corpora, dims: Sequence[int] = ()) -> None:
    """Everything that can be wrong with a scoring request short of the task data itself: poolers the model or
    template cannot serve, unknown or missing fit corpora, Matryoshka widths beyond the model's. Raises before any
    forward pass."""
    check_dims(dims, encoder.hidden_size)
    encoder.check_poolers(poolers, template)
    load_fit_corpora(poolers, has_posts, fit_corpus, corpora)


def encode_plans(encoder: Encoder, index: SentenceIndex, loaded: Sequence, poolers: Sequence[Pooler],
                 options: ScoringOptions, corpora: Corpora, max_sentence_tokens: int | None
                 ) -> tuple[list, list[PooledEmbeddings], np.ndarray | None]:
    """One pass over the indexed sentences (plus the fit corpus's, when post-processors are fitted on one): the
    pooler plans (idf fitted per task on "T"), their embeddings, and the fit corpus's rows in the index."""
    reference_rows = None
    if options.posts and options.fit_corpus != TARGET:
        reference_rows = np.unique(index.add(corpora.sentences(options.fit_corpus)))
    plans = plan_poolers(poolers, loaded, lambda task: [index.sentences[i] for i in task_rows(task)],
                         options.fit_corpus, corpora, encoder.tokenizer)
    instances = [instance for plan in plans for instance in plan.instances]
    embeddings = encoder.embed(index.sentences, instances, options.template, options.sentence_rule,
                               max_sentence_tokens)
    pooled = [PooledEmbeddings(plan.label, shared=None if plan.per_task else embeddings[plan.pooler.name],
                               per_task={task: embeddings[p.name] for task, p in plan.per_task.items()})
              for plan in plans]
    return plans, pooled, reference_rows


def report_truncation(loaded: Sequence, truncation: dict[str, Truncation]) -> dict[str, dict]:
    """Per task and input form: how many of the task's unique sentences were cut to the token limit. Each non-zero
    count is logged once per process, e.g. `STS12: 312 of 8,000 sentences longer than 128 tokens were truncated`."""
    counts: dict[str, dict] = {}
    for task in loaded:
        rows, name = task_rows(task), task.spec.name
        counts[name] = {}
        for label, cut in truncation.items():
            count = int(cut.truncated[rows].sum())
            counts[name][label] = {"truncated": count, "sentences": len(rows), "max_tokens": cut.max_sentence_tokens}
            key = (name, label, cut.max_sentence_tokens, count)
            if count and key not in _REPORTED_TRUNCATION:
                _REPORTED_TRUNCATION.add(key)
                log.warning("%s: %s of %s sentences longer than %d tokens were truncated (%s input)", name,
                            f"{count:,}", f"{len(rows):,}", cut.max_sentence_tokens, label)
    return counts
