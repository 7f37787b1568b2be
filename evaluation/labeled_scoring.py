"""Transfer and clustering tasks through the STS spine: the same Encoder pass (one forward per unique sentence and
input form, every pooler at once), the same pooler plans (idf fitted per task on "T") and the same post-processor
variants (fitted on each task's own sentences for "T", else on the named corpus), scored by
evaluation/transfer.py or evaluation/clustering.py instead of cosine/Spearman.

A task's sentence truncation is the tighter of the run's `max_sentence_tokens` and the task's own (clustering: 62,
the reference's 64-token inputs less [CLS]/[SEP]); tasks that share a truncation share one sentence index and pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from promptemb.data.labeled_readers import LabeledSplit
from promptemb.data.tasks import TaskSpec
from promptemb.encoder.model import Encoder
from promptemb.evaluation.clustering import ClusteringConfig, evaluate_clustering
from promptemb.evaluation.pooler_variants import score_variants
from promptemb.evaluation.scoring_options import DEFAULT_OPTIONS, ScoringOptions
from promptemb.evaluation.sts import SentenceIndex, check_scoring, encode_plans
from promptemb.evaluation.transfer import ClassifierConfig, TransferData, evaluate_transfer
from promptemb.poolers.base import Pooler


@dataclass
class LabeledTask:
    """A transfer or clustering task indexed into a sentence index (duck-types `IndexedTask` for pooler plans and
    post-processor variants: `left` holds every row the task uses, `right` none)."""

    spec: TaskSpec
    splits: dict[str, LabeledSplit]
    rows: dict[str, dict] = field(default_factory=dict)  # split -> {"left", "right", "labels"}
    left: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    right: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def indexed(cls, spec: TaskSpec, splits: dict[str, LabeledSplit], index: SentenceIndex) -> LabeledTask:
        task = cls(spec, splits)
        for name, split in splits.items():
            task.rows[name] = {"left": index.add(split.sentences),
                               "right": index.add(split.sentences2) if split.is_pairs else None,
                               "labels": split.labels}
        task.left = np.concatenate([r for part in task.rows.values() for r in (part["left"], part["right"])
                                    if r is not None])
        return task


def effective_truncation(spec: TaskSpec, max_sentence_tokens: int | None) -> int | None:
    limits = [limit for limit in (max_sentence_tokens, spec.max_sentence_tokens) if limit is not None]
    return min(limits) if limits else None


def score_labeled_task(task: LabeledTask, embeddings: np.ndarray, transfer_config: ClassifierConfig,
                       clustering_config: ClusteringConfig, device: torch.device | None = None) -> dict:
    """The task's record; the classifiers train on `device` (the scoring model's), k-means runs there or on the
    CPU's cores as `clustering_config.kmeans` picks."""
    started = time.perf_counter()
    if task.spec.family == "clustering":
        part = task.rows["all"]
        record = evaluate_clustering(embeddings[part["left"]], part["labels"], clustering_config, device=device)
    else:
        classes = int(max(part["labels"].max() for part in task.rows.values())) + 1
        data = TransferData(task.spec.record["protocol"], task.rows, classes, f1=bool(task.spec.record.get("f1")))
        record = evaluate_transfer(data, embeddings, transfer_config, device=device)
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def evaluate_labeled(
    encoder: Encoder,
    tasks: Sequence[TaskSpec],
    root: Path,
    poolers: Sequence[Pooler],
    options: ScoringOptions = DEFAULT_OPTIONS,
    transfer_config: ClassifierConfig | None = None,
    clustering_config: ClusteringConfig | None = None,
) -> dict:
    """Score every pooler (raw and with each post-processor) on transfer/clustering `tasks` (one family); the result
    has the shape of `evaluate_sts`'s: {"scores": {label: {task: main x100, "avg"}}, "details", "post_processing",
    "poolers", "fit_corpora", "tasks", "unique_sentences"}, plus "timing": wall and process-CPU seconds of encoding
    and of classifier / k-means scoring."""
    transfer_config, clustering_config = transfer_config or ClassifierConfig(), clustering_config or ClusteringConfig()
    corpora = options.corpora_for(root, tasks)
    check_scoring(encoder, poolers, options.template, bool(options.posts), options.fit_corpus, corpora, options.dims)
    # read and verify every task before any encoding, so bad data fails fast
    loaded_splits = [(spec, spec.load_labeled(root)) for spec in tasks]
    groups: dict[int | None, list] = {}
    for spec, splits in loaded_splits:
        groups.setdefault(effective_truncation(spec, options.max_sentence_tokens), []).append((spec, splits))
    merged: dict = {"details": {}, "post_processing": {}, "poolers": {}, "tasks": {}}
    unique, encode_s, score_s, encode_cpu, score_cpu = 0, 0.0, 0.0, 0.0, 0.0
    for truncation, members in groups.items():
        index = SentenceIndex()
        loaded = [LabeledTask.indexed(spec, splits, index) for spec, splits in members]
        started, cpu = time.perf_counter(), time.process_time()
        plans, pooled, reference_rows = encode_plans(encoder, index, loaded, poolers, options, corpora, truncation)
        encode_s, encode_cpu = encode_s + time.perf_counter() - started, encode_cpu + time.process_time() - cpu
        started, cpu = time.perf_counter(), time.process_time()
        result = score_variants(
            loaded, pooled,
            lambda task, emb: score_labeled_task(task, emb, transfer_config, clustering_config, encoder.device),
            options.posts, options.fit_corpus, reference_rows, main_key="accuracy", dims=options.dims)
        score_s, score_cpu = score_s + time.perf_counter() - started, score_cpu + time.process_time() - cpu
        for label, per_task in result["details"].items():
            merged["details"].setdefault(label, {}).update(per_task)
        merged["post_processing"].update(result["post_processing"] or {})
        merged["poolers"].update({plan.label: plan.describe() for plan in plans})
        for task in loaded:
            merged["tasks"][task.spec.name] = {
                "family": task.spec.family, "split": task.spec.split, "main_score": task.spec.main_score,
                "examples": {name: len(split) for name, split in task.splits.items()},
                "max_sentence_tokens": truncation, "files": task.spec.files(),
                "protocol": task.spec.record.get("protocol", "kmeans"),
            }
        unique += len(index.sentences)
    order = [spec.name for spec in tasks]
    scores = {}
    for label, per_task in merged["details"].items():
        main = {name: per_task[name]["accuracy"] for name in order if name in per_task}
        scores[label] = {**main, "avg": float(np.mean(list(main.values())))}
    family = tasks[0].family if tasks else "transfer"
    protocol = clustering_config.describe() if family == "clustering" else transfer_config.describe()
    return {"scores": scores, "details": merged["details"], "analysis": None,
            "post_processing": merged["post_processing"] or None, "poolers": merged["poolers"],
            "fit_corpora": corpora.sources, "tasks": merged["tasks"], "unique_sentences": unique,
            "protocol": protocol, "timing": {"encode_s": round(encode_s, 2), "score_s": round(score_s, 2),
                                                     "encode_cpu_s": round(encode_cpu, 2),
                                                     "score_cpu_s": round(score_cpu, 2)}}
