"""Fit corpus-fitted poolers (idf) before encoding: one instance per task for "T", else one for the named corpus."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

from promptemb.common.errors import ConfigError
from promptemb.data.fit_corpora import TARGET, Corpora
from promptemb.poolers.base import Pooler
from promptemb.poolers.fitted import CorpusFittedPooler


@dataclass
class PoolerPlan:
    """A configured pooler and the instances that run for it: itself, or one fitted copy per task."""

    pooler: Pooler
    per_task: dict[str, Pooler] = field(default_factory=dict)

    @property
    def instances(self) -> list[Pooler]:
        return list(self.per_task.values()) or [self.pooler]

    @property
    def label(self) -> str:
        return f"{self.pooler.name}({TARGET})" if self.per_task else self.pooler.label

    def describe(self) -> dict:
        record = self.pooler.describe()
        if self.per_task:
            record = next(iter(self.per_task.values())).describe()
            record["fit_corpus_sentences"] = {task: p.corpus_size for task, p in self.per_task.items()}
        return record


def load_fit_corpora(poolers: Sequence[Pooler], has_posts: bool, fit_corpus: str, corpora: Corpora) -> None:
    """Reads every named (non-"T") corpus the poolers and post-processors will be fitted on, so a missing or empty
    file fails before any encoding (or, in the training callback, before training) rather than after it."""
    corpora.check_label(fit_corpus)
    labels = {pooler.corpus or fit_corpus for pooler in poolers if isinstance(pooler, CorpusFittedPooler)}
    if has_posts:
        labels.add(fit_corpus)
    for label in sorted(labels - {TARGET}):
        corpora.check_label(label)
        if not corpora.sentences(label):
            raise ConfigError(f"fit corpus {label!r} has no sentences; pass a corpus with at least one line")


def plan_poolers(poolers: Sequence[Pooler], tasks: Sequence, task_sentences, fit_corpus: str, corpora: Corpora,
                 tokenizer) -> list[PoolerPlan]:
    """`task_sentences(task)` gives a task's unique sentences; a pooler's own `corpus` overrides `fit_corpus`."""
    plans = []
    for pooler in poolers:
        plan = PoolerPlan(pooler)
        if isinstance(pooler, CorpusFittedPooler):
            label = pooler.corpus or fit_corpus
            corpora.check_label(label)
            if label == TARGET:
                for task in tasks:
                    clone = copy.deepcopy(pooler)
                    clone.name = f"{pooler.name}@{task.spec.name}"  # unique key for Encoder.embed
                    clone.fit(TARGET, task_sentences(task), tokenizer)
                    plan.per_task[task.spec.name] = clone
            else:
                pooler.fit(label, corpora.sentences(label), tokenizer)
        plans.append(plan)
    return plans
