"""STS scoring, SentEval "all" setting as SimCSE and PromptBERT report it.

score(task) = 100 · Spearman(cos(e(s1_i), e(s2_i)), gold_i) over ALL scored pairs of the task at once (for STS12-16,
the concatenation of every subset of the year; blank gold lines already dropped by the reader). Spearman is
scipy's (ties get average ranks). No regressor is trained: STS-B and SICK-R use their test split with cosine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr, spearmanr

from promptemb.data.fit_corpora import TARGET, Corpora
from promptemb.data.readers import SentencePairs
from promptemb.data.tasks import TaskSpec
from promptemb.encoder.model import Encoder, Truncation
from promptemb.encoder.template import Template
from promptemb.evaluation.fitting import load_fit_corpora, plan_poolers
from promptemb.evaluation.pooler_variants import PooledEmbeddings, score_variants, task_rows
from promptemb.evaluation.scoring_options import DEFAULT_OPTIONS, ScoringOptions, check_dims
from promptemb.poolers.base import Pooler

log = logging.getLogger(__name__)
#: truncation counts already reported in this process (the training callback scores STS-B dev again and again)
_REPORTED_TRUNCATION: set[tuple] = set()


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
class SentenceIndex:
    """The unique sentences of several tasks, so each is encoded once; pairs refer to rows by index."""

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


@dataclass
class IndexedTask:
    spec: TaskSpec
    pairs: SentencePairs
    left: np.ndarray
    right: np.ndarray


def load_and_index(tasks: Sequence[TaskSpec], root: Path, index: SentenceIndex) -> list[IndexedTask]:
    """Verify and read every task (all before any encoding, so bad data fails fast)."""
    loaded = []
    for spec in tasks:
        pairs = spec.load(root)
        loaded.append(IndexedTask(spec, pairs, index.add(pairs.sentences1), index.add(pairs.sentences2)))
    return loaded


def score_task(task: IndexedTask, embeddings: np.ndarray) -> dict:
    """Main score over all pairs, plus per-subset scores for STS12-16 (reported, never averaged into the main)."""
    cosines = cosine_rows(embeddings[task.left], embeddings[task.right])
    gold = task.pairs.gold_array()
    result = {"spearman": spearman_x100(cosines, gold), "pearson": pearson_x100(cosines, gold), "pairs": len(gold)}
    subsets = np.asarray(task.pairs.subsets)
    names = list(dict.fromkeys(task.pairs.subsets))
    if len(names) > 1:
        result["subsets"] = {name: spearman_x100(cosines[subsets == name], gold[subsets == name]) for name in names}
    return result


def report_truncation(loaded: Sequence[IndexedTask], truncation: dict[str, Truncation]) -> dict[str, dict]:
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


def check_scoring(encoder: Encoder, poolers: Sequence[Pooler], template: Template | None, has_posts: bool,
                  fit_corpus: str, corpora: Corpora, dims: Sequence[int] = ()) -> None:
    """Everything that can be wrong with a scoring request short of the STS data itself: poolers the model or
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


def evaluate_sts(
    encoder: Encoder,
    tasks: Sequence[TaskSpec],
    root: Path,
    poolers: Sequence[Pooler],
    options: ScoringOptions = DEFAULT_OPTIONS,
    analyse: Callable | None = None,
) -> dict:
    """Score every pooler (raw and with each post-processor) on every task with one forward pass per
    (unique sentence, input form).

    Post-processors fitted on "T" use each task's own embeddings; on another corpus, its sentences join the
    sentence index and are encoded in the same pass. Returns {"scores": {label: {task: x100, "avg": mean}},
    "details", "post_processing", "analysis", "poolers" (provenance per label), "tasks", "unique_sentences",
    "timing" (wall seconds of encoding and of scoring)}.
    """
    corpora = options.corpora_for(root, tasks)
    check_scoring(encoder, poolers, options.template, bool(options.posts), options.fit_corpus, corpora, options.dims)
    index = SentenceIndex()
    loaded = load_and_index(tasks, root, index)
    started = time.perf_counter()
    plans, pooled, reference_rows = encode_plans(encoder, index, loaded, poolers, options, corpora,
                                                 options.max_sentence_tokens)
    encoded = time.perf_counter()
    truncated = report_truncation(loaded, encoder.truncation)
    result = score_variants(loaded, pooled, score_task, options.posts, options.fit_corpus, reference_rows, analyse,
                            dims=options.dims)
    result["timing"] = {"encode_s": round(encoded - started, 2), "score_s": round(time.perf_counter() - encoded, 2)}
    result["poolers"] = {plan.label: plan.describe() for plan in plans}
    result["fit_corpora"] = corpora.sources
    result["tasks"] = {
        task.spec.name: {
            "split": task.spec.split,
            "pairs": len(task.pairs),
            "main_score": task.spec.main_score,
            "files": task.spec.files(),
            "truncated": truncated[task.spec.name],
        }
        for task in loaded
    }
    result["unique_sentences"] = len(index.sentences)
    return result
