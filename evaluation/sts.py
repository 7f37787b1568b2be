"""STS scoring, SentEval "all" setting as SimCSE and PromptBERT report it: the `sts` evaluation family.

score(task) = 100 · Spearman(cos(e(s1_i), e(s2_i)), gold_i) over ALL scored pairs of the task at once (for STS12-16,
the concatenation of every subset of the year; blank gold lines already dropped by the reader). Spearman is
scipy's (ties get average ranks). No regressor is trained: STS-B and SICK-R use their test split with cosine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr, spearmanr

from promptemb.data.readers import SentencePairs
from promptemb.data.tasks import TaskSpec
from promptemb.encoder.model import Encoder
from promptemb.evaluation.analysis import analyse_task
from promptemb.evaluation.encoding_pass import SentenceIndex
from promptemb.evaluation.family import EvaluationFamily, IndexedTask
from promptemb.evaluation.scoring_options import DEFAULT_OPTIONS, ScoringOptions
from promptemb.poolers.base import Pooler


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity, computed in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.maximum(norms, 1e-12)


def spearman_x100(predicted: np.ndarray, gold: np.ndarray) -> float:
    return float(spearmanr(predicted, gold).statistic * 100.0)


def pearson_x100(predicted: np.ndarray, gold: np.ndarray) -> float:
    return float(pearsonr(predicted, gold).statistic * 100.0)


@dataclass
class PairTask(IndexedTask):
    """An STS task in the sentence index: its scored pairs and the index rows of their two sides."""

    @property
    def pairs(self) -> SentencePairs:
        return self.data

    @property
    def left(self) -> np.ndarray:
        return self.ids["left"]

    @property
    def right(self) -> np.ndarray:
        return self.ids["right"]


def score_task(task: PairTask, embeddings: np.ndarray) -> dict:
    """Main score over all pairs, plus per-subset scores for STS12-16 (reported, never averaged into the main)."""
    cosines = cosine_rows(embeddings[task.left], embeddings[task.right])
    gold = task.pairs.gold_array()
    result = {"spearman": spearman_x100(cosines, gold), "pearson": pearson_x100(cosines, gold), "pairs": len(gold)}
    subsets = np.asarray(task.pairs.subsets)
    names = list(dict.fromkeys(task.pairs.subsets))
    if len(names) > 1:
        result["subsets"] = {name: spearman_x100(cosines[subsets == name], gold[subsets == name]) for name in names}
    return result


class STSFamily(EvaluationFamily):
    """Semantic textual similarity: cosine of the two sentences of each pair against the gold score, Spearman x100
    over all pairs of a task (Pearson alongside)."""

    name = "sts"
    primary_metric = "spearman"
    title = "STS"
    summary = "cosine, Spearman x100, SentEval 'all' setting"
    axis_label = "Spearman x100 (cosine)"
    task_type = PairTask

    def read(self, spec: TaskSpec, root: Path) -> SentencePairs:
        return spec.load(root)

    def sentences(self, data: SentencePairs) -> dict[str, list[str]]:
        return {"left": data.sentences1, "right": data.sentences2}

    def score_task(self, task: PairTask, embeddings: np.ndarray) -> dict:
        return score_task(task, embeddings)

    def describe(self) -> dict:
        return {"metric": "cosine similarity, Spearman x100, SentEval 'all' setting"}

    def describe_task(self, task: PairTask) -> dict:
        return {"pairs": len(task.pairs)}

    def analyser(self) -> Callable:
        return analyse_task


def load_and_index(tasks: Sequence[TaskSpec], root: Path, index: SentenceIndex) -> list[PairTask]:
    """Verify and read every task (all before any encoding, so bad data fails fast)."""
    family = STSFamily()
    return [family.index(spec, family.read(spec, root), index) for spec in tasks]


def evaluate_sts(
    encoder: Encoder,
    tasks: Sequence[TaskSpec],
    root: Path,
    poolers: Sequence[Pooler],
    options: ScoringOptions = DEFAULT_OPTIONS,
    analyse: Callable | None = None,
) -> dict:
    """Score every pooler (raw and with each post-processor) on every STS task with one forward pass per
    (unique sentence, input form): the `sts` family's call (evaluation/family.py `EvaluationFamily.score` gives the
    result's shape)."""
    return STSFamily()(encoder, tasks, root, poolers, options, analyse)
