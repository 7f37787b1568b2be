"""Paraphrase retrieval as an evaluation family of your own, written outside promptemb: in an STS task, the first
sentence of every pair whose gold similarity is at least `min_gold` (a near paraphrase) is a query that must find its
partner among all the task's second sentences by cosine similarity. Reported per task: recall@1 x100 (the partner
ranks first) and the mean reciprocal rank x100 of the partner.

    python evaluate.py imports=[small_family] task_registry=small_family_tasks.yaml 'tasks=[STSB-retrieval]' \
        'poolers=[mean,cls]'
    python evaluate.py imports=[small_family] task_registry=small_family_tasks.yaml 'tasks=[retrieval]' \
        +family_args.paraphrase_retrieval.min_gold=4.5

Its tasks are records of small_family_tasks.yaml with `family: paraphrase_retrieval`. (docs/extending.md walks
through it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from promptemb.common.errors import DataError
from promptemb.data.readers import SentencePairs
from promptemb.data.tasks import TaskSpec
from promptemb.evaluation.families import EvaluationFamily, IndexedTask, register_family


@dataclass(frozen=True)
class RetrievalSettings:
    """`+family_args.paraphrase_retrieval.*`."""

    min_gold: float = 4.0  # pairs at least this similar (STS-B 0-5, SICK 1-5) give a query


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@register_family("paraphrase_retrieval")
class ParaphraseRetrieval(EvaluationFamily):
    primary_metric = "recall_at_1"
    title = "Paraphrase retrieval"
    summary = ("the first sentence of each near-paraphrase pair retrieves its partner among all second sentences by "
               "cosine; recall@1 x100 (MRR in results.json)")
    axis_label = "recall@1 x100"
    Settings = RetrievalSettings

    def read(self, spec: TaskSpec, root: Path) -> SentencePairs:
        return spec.load(root)  # the record's STS-formatted pairs and gold scores, every file's sha256 checked

    def sentences(self, pairs: SentencePairs) -> dict[str, list[str]]:
        return {"queries": pairs.sentences1, "documents": pairs.sentences2}

    def score_task(self, task: IndexedTask, embeddings: np.ndarray) -> dict:
        queries = np.flatnonzero(task.data.gold_array() >= self.settings.min_gold)
        if not len(queries):
            raise DataError(f"task {task.spec.name}: no pair has a gold score >= {self.settings.min_gold}; lower "
                            "family_args.paraphrase_retrieval.min_gold")
        query_rows = task.ids["queries"][queries]
        documents = np.unique(task.ids["documents"])  # each distinct second sentence once (sentence-index rows)
        partner = np.searchsorted(documents, task.ids["documents"][queries])  # the column of each query's partner
        similarity = unit_rows(embeddings[query_rows]) @ unit_rows(embeddings[documents]).T
        # a document that is the query sentence itself is no answer (unless it is also the partner)
        itself = documents[None, :] == query_rows[:, None]
        itself[np.arange(len(queries)), partner] = False
        similarity[itself] = -np.inf
        target = similarity[np.arange(len(queries)), partner]
        rank = 1 + (similarity > target[:, None]).sum(1)  # a document as close as the partner does not outrank it
        return {"recall_at_1": float(np.mean(rank == 1) * 100), "mrr": float(np.mean(1.0 / rank) * 100),
                "queries": len(queries), "documents": len(documents)}
