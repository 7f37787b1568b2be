"""One scoring session: what evaluate.py and the training callback both score with, built once from the same settings
(`configs/scoring/`): the poolers, the post-processors and the corpus they are fitted on, the task registry, the
evaluation families with their settings (`family_args`), the analysis switch; then scoring and the report.

    session = ScoringSession(ScoringSettings(poolers=["mean"], post=["quantile_u"]), data_root)
    result = session.score(encoder, ["STSBenchmark"], poolers, session.options(template, "none"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from promptemb.common.errors import ConfigError
from promptemb.data.fit_corpora import Corpora
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import REGISTRY_FILE, TaskSpec, get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.encoding_pass import check_scoring
from promptemb.evaluation.families import build_families, check_task_families, evaluate_tasks
from promptemb.evaluation.report import attach_scoring_details, scoring_provenance, write_report
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.settings import ScoringSettings
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_poolers
from promptemb.poolers.base import Pooler
from promptemb.poolers.registry import argument_names
from promptemb.postprocessing import build_posts


class ScoringSession:
    """Everything about scoring that does not depend on the model: built (and checked) at once, so an unknown pooler,
    post-processor, fit corpus, evaluation family or family setting fails before any model loads; the data root is
    resolved when first needed."""

    def __init__(self, settings: ScoringSettings, data_root: str | None = None, other_poolers: Sequence[str] = (),
                 poolers_required: bool = True):
        """`other_poolers`: names the caller scores besides `settings.poolers` (the training callback's dev
        poolers), which `pooler_args` may configure too; `poolers_required`: no pooler at all is an error."""
        self.settings = settings
        self.data_root = data_root
        self.pooler_args = dict(settings.pooler_args or {})
        names = [*settings.poolers, *(name for name in other_poolers if name not in settings.poolers)]
        if self.pooler_args and not names:  # arguments no pooler would read
            raise ConfigError(f"pooler_args given for {', '.join(sorted(self.pooler_args))}, which is not in "
                              "poolers=[]")
        built = build_poolers(names, self.pooler_args) if names or poolers_required else []
        self.poolers = built[:len(settings.poolers)]
        self.posts = build_posts(list(settings.post), dict(settings.post_args or {}))
        Corpora.check_label(settings.fit_corpus)
        self.registry_file = Path(settings.task_registry) if settings.task_registry else REGISTRY_FILE
        self.families = build_families(settings.family_args)
        self._corpora: Corpora | None = None

    @property
    def fit_corpus(self) -> str:
        return self.settings.fit_corpus

    def build_poolers(self, names: list[str]) -> list[Pooler]:
        """The named poolers (a subset of the session's) with their `pooler_args`."""
        if not names:
            return []
        known = argument_names(names, self.pooler_args)  # the names and their ensembles' members
        return build_poolers(names, {k: v for k, v in self.pooler_args.items() if k in known})

    def corpora(self) -> Corpora:
        """The task registry's corpora under the data root (resolved and read once)."""
        if self._corpora is None:
            self._corpora = Corpora(resolve_data_root(self.data_root), load_registry(self.registry_file))
        return self._corpora

    def tasks(self, names: Sequence[str]) -> list[TaskSpec]:
        """The tasks of `names` (task names and groups), each of a registered evaluation family (the registry alone
        is read: names are checked before the data root is needed)."""
        tasks = get_tasks(list(names), load_registry(self.registry_file))
        check_task_families(tasks, f"task_registry={self.registry_file}")
        return tasks

    def check_family_args(self, tasks: Sequence[TaskSpec], names: Sequence[str], key: str = "tasks",
                          prefix: str = "") -> None:
        """Each family given settings (`family_args.NAME`) scores one of `tasks` (`self.tasks(names)`) at least:
        settings no task reads would be accepted and ignored."""
        scored = {task.family for task in tasks}
        for name in self.settings.family_args or {}:
            if name not in scored:
                raise ConfigError(f"{prefix}family_args.{name} is read by no task of {key}=[{','.join(names)}] (none "
                                  f"is a {name} task): drop it, or add a {name} task")

    def options(self, template: Template | None, sentence_rule: str, max_sentence_tokens: int | None = None,
                post_processors: bool = True, dims: Sequence[int] | None = None) -> ScoringOptions:
        """`dims`: the Matryoshka widths scored (default: the settings'; the training callback passes a trained
        model's own when none are set)."""
        return ScoringOptions(template, sentence_rule, max_sentence_tokens,
                              self.posts if post_processors else (), self.fit_corpus, self.corpora(),
                              tuple(self.settings.dims if dims is None else dims))

    def check(self, encoder: Encoder, poolers: list[Pooler], template: Template | None,
              post_processors: bool = True, dims: Sequence[int] | None = None) -> None:
        """The poolers against the model (Ditto head, attentions, MLM head, template), their fit corpora and the
        Matryoshka widths (`dims`, default the settings')."""
        check_scoring(encoder, poolers, template, post_processors and bool(self.posts), self.fit_corpus,
                      self.corpora(), self.settings.dims if dims is None else dims)

    def score(self, encoder: Encoder, task_names: Sequence[str], poolers: list[Pooler], options: ScoringOptions,
              full: bool = True) -> dict:
        """`full`: any task family, post-processors as configured, analysis when asked (evaluate.py, the final
        scoring of a run); otherwise the STS scorer alone (the dev evaluation during training)."""
        tasks = self.tasks(task_names)
        if not full:
            return evaluate_sts(encoder, tasks, self.corpora().root, poolers, options)
        return evaluate_tasks(encoder, tasks, self.corpora().root, poolers, options, analysis=self.settings.analysis,
                              families=self.families)

    def provenance(self, encoder: Encoder, options: ScoringOptions, poolers: list[Pooler], result: dict,
                   versions: dict | None = None) -> dict:
        """The provenance record of `result` (moves its scoring details into the record)."""
        prov = scoring_provenance(encoder, options.template, options.sentence_rule, options.max_sentence_tokens,
                                  poolers, versions)
        prov["dims"] = list(options.dims)  # rows `pooler@d`: the first d components, truncated before normalising
        return attach_scoring_details(prov, result, self.fit_corpus)

    @staticmethod
    def record(result: dict, provenance: dict) -> dict:
        """What results.json holds: the scores of every family, their details and the provenance."""
        return {"scores": result["scores"], "pearson": result.get("pearson"), "details": result["details"],
                "analysis": result["analysis"], "families": result["families"], "provenance": provenance}

    @staticmethod
    def report(output_dir: Path, record: dict) -> tuple[Path, Path]:
        """results.json, results.md and one PNG per task family."""
        return write_report(Path(output_dir), record)
