"""Score a task list that mixes families (STS, transfer, clustering): each family through its scorer, one result.

The result has `evaluate_sts`'s shape for the first family present (in the order sts, transfer, clustering), so
STS-only consumers read `scores` as before, plus `families`: {family: {"scores", "details", "timing", "protocol"}}
for every family in the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from promptemb.data.tasks import FAMILIES, TaskSpec
from promptemb.encoder.model import Encoder
from promptemb.evaluation.clustering import ClusteringConfig
from promptemb.evaluation.labeled_scoring import evaluate_labeled
from promptemb.evaluation.scoring_options import DEFAULT_OPTIONS, ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.evaluation.transfer import ClassifierConfig
from promptemb.poolers.base import Pooler

STS_PROTOCOL = {"metric": "cosine similarity, Spearman x100, SentEval 'all' setting"}


def evaluate_tasks(
    encoder: Encoder,
    tasks: Sequence[TaskSpec],
    root: Path,
    poolers: Sequence[Pooler],
    options: ScoringOptions = DEFAULT_OPTIONS,
    analyse: Callable | None = None,
    transfer_config: ClassifierConfig | None = None,
    clustering_config: ClusteringConfig | None = None,
) -> dict:
    by_family = {family: [spec for spec in tasks if spec.family == family] for family in FAMILIES}
    by_family = {family: specs for family, specs in by_family.items() if specs}
    # read and verify every family's data before any encoding, so bad data fails before the long part
    for family, specs in by_family.items():
        for spec in specs:
            spec.load(root) if family == "sts" else spec.load_labeled(root)
    results: dict[str, dict] = {}
    for family, specs in by_family.items():
        if family == "sts":
            started = time.perf_counter()
            result = evaluate_sts(encoder, specs, root, poolers, options, analyse=analyse)
            result["timing"] = {**result["timing"], "total_s": round(time.perf_counter() - started, 2)}
            result["protocol"] = STS_PROTOCOL
        else:
            result = evaluate_labeled(encoder, specs, root, poolers, options, transfer_config=transfer_config,
                                      clustering_config=clustering_config)
        results[family] = result
    first = next(iter(results.values()))
    merged = {
        "scores": first["scores"], "pearson": first.get("pearson"), "details": first["details"],
        "analysis": first.get("analysis"),
        "families": {family: {key: result.get(key) for key in ("scores", "pearson", "details", "timing", "protocol")}
                     for family, result in results.items()},
        "poolers": {}, "post_processing": {}, "fit_corpora": {}, "tasks": {}, "unique_sentences": 0,
    }
    for result in results.values():
        merged["poolers"].update(result["poolers"])
        merged["post_processing"].update(result["post_processing"] or {})
        merged["fit_corpora"].update(result["fit_corpora"])
        merged["tasks"].update(result["tasks"])
        merged["unique_sentences"] += result["unique_sentences"]
    merged["post_processing"] = merged["post_processing"] or None
    return merged
