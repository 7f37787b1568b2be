"""Task families a research driver can score on, behind one interface, so a driver written for STS runs unchanged on
another family once that family registers a builder here.

A task group turns (encoder, poolers, input form, post-processors) into `{"scores": {label: {task: x100, "avg"}},
...}` — the shape `evaluation.sts.evaluate_sts` returns — with one forward pass per (unique sentence, input form).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from data.root import resolve_data_root
from data.tasks import REGISTRY_FILE, STS_SUITE, TaskSpec, get_tasks, load_registry
from encoder.model import Encoder
from encoder.template import Template
from evaluation.corpora import TARGET, Corpora
from evaluation.sts import evaluate_sts
from poolers.base import Pooler
from postprocessing.base import PostProcessor


@dataclass
class StsTaskGroup:
    """STS tasks scored as `evaluate.py` scores them (cosine, Spearman x100, SentEval "all" setting)."""

    tasks: list[TaskSpec]
    root: Path
    corpora: Corpora
    family: str = "sts"
    metric: str = "Spearman x100 (cosine)"

    @property
    def task_names(self) -> list[str]:
        return [task.name for task in self.tasks]

    def score(self, encoder: Encoder, poolers: Sequence[Pooler], template: Template | None = None,
              sentence_rule: str = "none", posts: Sequence[PostProcessor] = (), fit_corpus: str = TARGET) -> dict:
        return evaluate_sts(encoder, self.tasks, self.root, poolers, template, sentence_rule, posts=posts,
                            fit_corpus=fit_corpus, corpora=self.corpora)


def build_sts_group(task_names: Sequence[str] | None, data_root: str | None, registry_file: str | Path | None):
    registry = load_registry(Path(registry_file or REGISTRY_FILE))
    root = resolve_data_root(data_root)
    return StsTaskGroup(get_tasks(list(task_names or STS_SUITE), registry), root, Corpora(root, registry))


#: family name -> builder(task names or None for the family's default suite, data root, registry file)
TASK_GROUPS: dict[str, Callable] = {"sts": build_sts_group}


def build_task_group(family: str, task_names: Sequence[str] | None = None, data_root: str | None = None,
                     registry_file: str | Path | None = None):
    if family not in TASK_GROUPS:
        raise ConfigError(f"unknown task family {family!r}; valid: {', '.join(TASK_GROUPS)}")
    return TASK_GROUPS[family](task_names, data_root, registry_file)
