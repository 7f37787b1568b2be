"""Score poolers x post-processors from precomputed embeddings (no encoder here): used by every evaluation family
(evaluation/family.py) and by any caller that already holds embeddings of a sentence index.

A *variant* is one pooler's embeddings, raw or passed through one post-processor fitted on a named corpus; its
label says both, e.g. `mean`, `mean+quantile_u(T)`, `idf(T)+whiten(W)`. With Matryoshka widths, each pooler is
also scored on its first d components (`mean@128`, truncated before any post-processor or normalisation: cosine
and every fit see the d-dimensional prefix), raw and through each post-processor (`mean@128+whiten(T)`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from promptemb.common.errors import ConfigError
from promptemb.data.fit_corpora import TARGET
from promptemb.postprocessing.base import PostProcessor


@dataclass
class PooledEmbeddings:
    """One pooler's embeddings of every sentence-index row: one array for all tasks (`shared`), or one per task
    when the pooler itself was fitted on each task's sentences (idf on "T")."""

    label: str
    shared: np.ndarray | None = None
    per_task: dict[str, np.ndarray] = field(default_factory=dict)

    def for_task(self, task: str) -> np.ndarray:
        return self.per_task.get(task, self.shared)


def task_rows(task) -> np.ndarray:
    """Index rows of the task's unique sentences, sorted: its unlabeled corpus "T" (evaluation/family.py
    `IndexedTask.rows`)."""
    return task.rows


def post_processed(embeddings: np.ndarray, rows: np.ndarray, post: PostProcessor, fit_label: str,
                   fit_rows: np.ndarray) -> tuple[np.ndarray, PostProcessor]:
    """A copy of `post` fitted on `embeddings[fit_rows]`, and `embeddings` with `rows` transformed by it (other rows
    zero). The width is the transform's: `whiten` with `k` keeps k of the D dimensions."""
    fitted = copy.deepcopy(post)
    if fitted.fitted_from_data:
        fitted.fit(fit_label, embeddings[fit_rows])
    transformed = fitted.transform(embeddings[rows])
    out = np.zeros((len(embeddings), transformed.shape[1]), dtype=np.float64)
    out[rows] = transformed
    return out, fitted


def score_variants(
    tasks: Sequence,
    pooled: Sequence[PooledEmbeddings],
    score_task: Callable,
    posts: Sequence[PostProcessor] = (),
    fit_corpus: str = TARGET,
    reference_rows: np.ndarray | None = None,
    analyse: Callable | None = None,
    main_key: str = "spearman",
    dims: Sequence[int] = (),
) -> dict:
    """Scores of every pooler, raw and with each post-processor, on every task.

    `tasks` are IndexedTasks (rows into the embedding arrays); `score_task(task, embeddings)` returns the task's
    score record; post-processors are fitted on the task's own rows when `fit_corpus` is "T", else on
    `reference_rows` (the corpus' sentences, encoded in the same pass). `analyse(task, embeddings)` (optional)
    returns extra metrics per variant and task. `main_key` names the score record's main score (the table value).
    `dims`: widths each pooler is also scored at (rows `label@d`; a width equal to the pooler's is its plain row).
    Returns {"scores": {label: {task: x100, "avg"}}, "pearson": (the same table of Pearson x100 where the records
    have one, i.e. STS; else None), "details": {...}, "post_processing": {label: record},
    "analysis": {label: {task: metrics}} or None}.
    """
    details: dict[str, dict[str, dict]] = {}
    post_records: dict[str, dict] = {}
    analysis: dict[str, dict[str, dict]] = {}
    for pooler in pooled:
        for task in tasks:
            name = task.spec.name
            rows = task_rows(task)
            variants = []
            for base, embeddings in truncations(pooler.label, pooler.for_task(name), dims):
                variants.append((base, embeddings))
                for post in posts:
                    fit_rows = rows if fit_corpus == TARGET else reference_rows
                    transformed, fitted = post_processed(embeddings, rows, post, fit_corpus, fit_rows)
                    label = f"{base}+{fitted.label}"
                    variants.append((label, transformed))
                    record = post_records.setdefault(label, {**fitted.describe(), "fit_corpus_size": {}})
                    record["fit_corpus_size"][name] = fitted.corpus_size
            for label, emb in variants:
                details.setdefault(label, {})[name] = score_task(task, emb)
                if analyse is not None:
                    analysis.setdefault(label, {})[name] = analyse(task, emb)
    has_pearson = all("pearson" in record for per_task in details.values() for record in per_task.values())
    return {"scores": metric_table(details, main_key),
            "pearson": metric_table(details, "pearson") if details and has_pearson else None,
            "details": details, "post_processing": post_records or None, "analysis": analysis or None}


def truncations(label: str, embeddings: np.ndarray, dims: Sequence[int]) -> list[tuple[str, np.ndarray]]:
    """(label, embeddings), then (`label@d`, the first d components) for each width d below the embeddings' own,
    widest first (Matryoshka evaluation: cosine of the prefix, normalised after truncation)."""
    width = embeddings.shape[1]
    if too_wide := [d for d in dims if d > width]:
        raise ConfigError(f"dims: {too_wide[0]} is wider than pooler {label}'s {width}-dimensional embeddings; use "
                          f"widths <= {width}")
    return [(label, embeddings)] + [(f"{label}@{d}", embeddings[:, :d]) for d in sorted(set(dims), reverse=True)
                                    if d < width]


def metric_table(details: dict[str, dict[str, dict]], metric: str) -> dict[str, dict[str, float]]:
    """{label: {task: details[label][task][metric], "avg": plain mean over the tasks}}."""
    table = {}
    for label, per_task in details.items():
        values = {name: record[metric] for name, record in per_task.items()}
        table[label] = {**values, "avg": float(np.mean(list(values.values())))}
    return table
