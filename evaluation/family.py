"""An evaluation family: one kind of scoring (STS, SentEval transfer, short-text clustering, or a user's own) as one
class with a small interface, as sentence-transformers' `SentenceEvaluator` is.

A family reads its tasks (the task registry's records with `family: NAME`), names the sentences each task needs
embedded, and scores one task from their embeddings; a call `family(encoder, tasks, root, poolers, options)` does
the rest the same way for every family: one encoder pass per (unique sentence, input form) for all poolers at once,
idf fitted per task, every post-processor variant, the Matryoshka widths, the per-family table and the provenance.

    @register_family("my_family")                      # promptemb.evaluation.families
    class MyFamily(EvaluationFamily):
        primary_metric = "recall_at_1"                 # the key of each task's record shown in the tables

        def read(self, spec, root):                    # the task's data, its files verified (before any encoding)
            return spec.load(root)
        def sentences(self, data):                     # {name: sentences}: what to embed
            return {"queries": data.sentences1, "documents": data.sentences2}
        def score_task(self, task, embeddings):        # the task's record, from its rows of `embeddings`
            queries = embeddings[task.ids["queries"]]
            ...
            return {"recall_at_1": ...}

Its own settings (`Settings`, a dataclass) come from `family_args.NAME` of the run's config.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from promptemb.common.errors import DataError
from promptemb.data.tasks import TaskSpec
from promptemb.encoder.model import Encoder
from promptemb.evaluation.encoding_pass import SentenceIndex, check_scoring, encode_plans, report_truncation
from promptemb.evaluation.pooler_variants import metric_table, score_variants
from promptemb.evaluation.scoring_options import DEFAULT_OPTIONS, ScoringOptions
from promptemb.poolers.base import Pooler


@dataclass
class IndexedTask:
    """A task read by its family, its sentences indexed into the pass's `SentenceIndex`: `ids[name]` are the index
    rows of the family's sentence list `name`, in order (so `embeddings[task.ids[name]]` are their embeddings)."""

    spec: TaskSpec
    data: Any
    ids: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def rows(self) -> np.ndarray:
        """Every index row the task uses, once, sorted: its unlabeled corpus "T" (what idf and post-processors fitted
        on "T" see)."""
        parts = [ids for ids in self.ids.values() if len(ids)]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def effective_truncation(spec: TaskSpec, max_sentence_tokens: int | None) -> int | None:
    """The tighter of the run's `max_sentence_tokens` and the task record's own (clustering: 62), if any."""
    limits = [limit for limit in (max_sentence_tokens, spec.max_sentence_tokens) if limit is not None]
    return min(limits) if limits else None


class EvaluationFamily:
    """One evaluation family. Subclasses set `primary_metric` (and the report's wording) and implement `read`,
    `sentences` and `score_task`; `Settings` (a dataclass, or None) is what `family_args.NAME` may set."""

    #: the registered name (set by the registry: `@register_family("NAME")`)
    name: ClassVar[str] = ""
    #: the key of each task's score record that the tables show (x100 by convention)
    primary_metric: ClassVar[str] = "accuracy"
    #: results.md: the family's heading and its protocol line; the PNG's y-axis
    title: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    axis_label: ClassVar[str] = ""
    #: the family's own settings (a dataclass whose fields `family_args.NAME.*` may set), or None for none
    Settings: ClassVar[type | None] = None
    #: what `index` builds: a subclass may add views of its data (STS: the pairs and their two sides)
    task_type: ClassVar[type[IndexedTask]] = IndexedTask

    def __init__(self, settings: Any = None):
        self.settings = settings if settings is not None or self.Settings is None else self.Settings()
        #: the scoring model's device during a call (for a family that computes there, e.g. its classifiers)
        self.device: torch.device | None = None

    # ---- what a family implements

    def read(self, spec: TaskSpec, root: Path) -> Any:
        """The task's data, every file verified against the record's sha256 (`spec.load(root)` for the pair
        formats, `spec.load_labeled(root)` for the labelled ones, or the family's own reader with
        `promptemb.data.checksums.verify_file`). Every task is read before any encoding, so bad data fails fast."""
        raise NotImplementedError

    def sentences(self, data: Any) -> Mapping[str, Sequence[str]]:
        """The sentence lists to embed, by name (in order: the order sentences enter the pass)."""
        raise NotImplementedError

    def score_task(self, task: IndexedTask, embeddings: np.ndarray) -> dict:
        """The task's score record (`primary_metric` among its keys) from one variant's embeddings: rows of the
        pass's sentence index, `embeddings[task.ids[name]]` for the list `name` (float32 or float64, not
        normalised)."""
        raise NotImplementedError

    def describe(self) -> dict:
        """The protocol record in results.json (`families.NAME.protocol`): the metric and the settings."""
        settings = asdict(self.settings) if is_dataclass(self.settings) else {}
        return {"metric": self.primary_metric, **settings}

    def describe_task(self, task: IndexedTask) -> dict:
        """What the provenance records about one task besides its split, files, truncation: the sentences per list."""
        return {"sentences": {name: len(ids) for name, ids in task.ids.items()}}

    def analyser(self) -> Callable | None:
        """`analysis=true`'s geometry metrics per variant and task (`fn(task, embeddings) -> dict`), for families
        whose tasks have them; None: none."""
        return None

    # ---- the shared spine

    def index(self, spec: TaskSpec, data: Any, index: SentenceIndex) -> IndexedTask:
        return self.task_type(spec, data, {name: index.add(sentences)
                                           for name, sentences in self.sentences(data).items()})

    def __call__(self, encoder: Encoder, tasks: Sequence[TaskSpec], root: Path, poolers: Sequence[Pooler],
                 options: ScoringOptions = DEFAULT_OPTIONS, analyse: Callable | None = None) -> dict:
        """Score every pooler (raw, with each post-processor, at each Matryoshka width) on every task of this family;
        see `score`."""
        check_scoring(encoder, poolers, options.template, bool(options.posts), options.fit_corpus,
                      options.corpora_for(root, tasks), options.dims)
        return self.score(encoder, [(spec, self.read(spec, root)) for spec in tasks], root, poolers, options,
                          analyse)

    def score(self, encoder: Encoder, read: Sequence[tuple[TaskSpec, Any]], root: Path, poolers: Sequence[Pooler],
              options: ScoringOptions = DEFAULT_OPTIONS, analyse: Callable | None = None) -> dict:
        """Score tasks already read (`read`: (record, data) pairs) with one forward pass per (unique sentence, input
        form); tasks that share a sentence truncation share one sentence index and pass.

        Post-processors fitted on "T" use each task's own embeddings; on another corpus, its sentences join the
        sentence index and are encoded in the same pass. Returns {"scores": {label: {task: x100, "avg": mean}},
        "pearson" (the same table where every record has a Pearson score, else None), "details", "post_processing",
        "analysis", "poolers" (provenance per label), "fit_corpora", "tasks", "unique_sentences", "protocol",
        "timing" (wall and process-CPU seconds of encoding and of scoring)}."""
        specs = [spec for spec, _ in read]
        self.device = encoder.device
        corpora = options.corpora_for(root, specs)
        check_scoring(encoder, poolers, options.template, bool(options.posts), options.fit_corpus, corpora,
                      options.dims)
        groups: dict[int | None, list] = {}
        for spec, data in read:
            groups.setdefault(effective_truncation(spec, options.max_sentence_tokens), []).append((spec, data))
        merged: dict = {"details": {}, "analysis": {}, "post_processing": {}, "poolers": {}, "tasks": {}}
        unique, timing = 0, dict.fromkeys(("encode_s", "score_s", "encode_cpu_s", "score_cpu_s"), 0.0)
        for truncation, members in groups.items():
            index = SentenceIndex()
            loaded = [self.index(spec, data, index) for spec, data in members]
            for task in loaded:
                if not len(task.rows):
                    raise DataError(f"task {task.spec.name}: the {self.name} family found no sentence to embed")
            started, cpu = time.perf_counter(), time.process_time()
            plans, pooled, reference_rows = encode_plans(encoder, index, loaded, poolers, options, corpora,
                                                         truncation)
            timing["encode_s"] += time.perf_counter() - started
            timing["encode_cpu_s"] += time.process_time() - cpu
            truncated = report_truncation(loaded, encoder.truncation)
            started, cpu = time.perf_counter(), time.process_time()
            result = score_variants(loaded, pooled, self.score_task, options.posts, options.fit_corpus,
                                    reference_rows, analyse, main_key=self.primary_metric, dims=options.dims)
            timing["score_s"] += time.perf_counter() - started
            timing["score_cpu_s"] += time.process_time() - cpu
            for key in ("details", "analysis"):
                for label, per_task in (result[key] or {}).items():
                    merged[key].setdefault(label, {}).update(per_task)
            merge_records(merged["post_processing"], result["post_processing"] or {}, "fit_corpus_size")
            merge_records(merged["poolers"], {plan.label: plan.describe() for plan in plans},
                          "fit_corpus_sentences")
            for task in loaded:
                spec = task.spec
                merged["tasks"][spec.name] = {
                    "family": self.name, "split": spec.split, "main_score": spec.main_score, "files": spec.files(),
                    "max_sentence_tokens": truncation, "truncated": truncated[spec.name], **self.describe_task(task)}
            unique += len(index.sentences)
        order = [spec.name for spec in specs]
        details = {label: {name: per_task[name] for name in order if name in per_task}
                   for label, per_task in merged["details"].items()}
        has_pearson = all("pearson" in record for per_task in details.values() for record in per_task.values())
        return {"scores": metric_table(details, self.primary_metric),
                "pearson": metric_table(details, "pearson") if details and has_pearson else None,
                "details": details, "analysis": merged["analysis"] or None,
                "post_processing": merged["post_processing"] or None, "poolers": merged["poolers"],
                "fit_corpora": corpora.sources, "tasks": {name: merged["tasks"][name] for name in order},
                "unique_sentences": unique, "protocol": self.describe(),
                "timing": {key: round(value, 2) for key, value in timing.items()}}


def merge_records(into: dict[str, dict], new: Mapping[str, dict], per_task_key: str) -> None:
    """Add `new`'s records (by label) to `into`; a label already there gains the new per-task entries of
    `per_task_key` (a record of one sentence-index pass names that pass's tasks only)."""
    for label, record in new.items():
        if label in into and isinstance(into[label].get(per_task_key), dict):
            into[label][per_task_key].update(record.get(per_task_key) or {})
        else:
            into[label] = record
