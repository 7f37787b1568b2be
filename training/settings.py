"""train.py's settings (configs/train.yaml), checked once when they are built from the composed config, before any
model or corpus is loaded: its own keys typed below; each group with a `_target_` (`model`, `optimizer`,
`scheduler`, `data`, `trainer`, `callbacks`, `logger`) is the node the builder instantiates (common/instantiate.py),
checked against its constructor's type hints; then the machine, the model files and the training data files.

    settings = TrainSettings.model_validate(values)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, model_validator

from promptemb.common.bounds import AtLeastOne, NonNegative, Positive, Seed
from promptemb.common.errors import ConfigError
from promptemb.common.run_context import RunPaths
from promptemb.common.validation import (
    CommandSettings,
    Settings,
    check_node,
    check_node_maps,
    check_targets,
    check_writable_dir,
    composition_only,
    declare_hints,
    target_nodes,
    target_of,
)
from promptemb.data.root import resolve_data_root
from promptemb.encoder.settings import TemplateSettings


class Extras(Settings):
    """The `extras` group (configs/extras/): conveniences around a training run."""

    described_as: ClassVar[str] = "the extras group"

    ignore_warnings: bool = False  # silence Python warnings (library deprecation notices)
    print_config: bool = False  # log the composed, resolved config as YAML when the run starts


class OptunaSearch(Settings):
    """The `hparams_search` group (configs/hparams_search/): an Optuna study over train.py's config."""

    described_as: ClassVar[str] = "the hparams_search group"

    study_name: str | None = None
    direction: Literal["maximize", "minimize"] = "maximize"
    n_trials: AtLeastOne
    storage: str | None = None  # e.g. sqlite:///optuna.db to keep and continue the study
    sampler: dict | None = None  # a `_target_` node (optuna.samplers.TPESampler, ...)
    enqueue: list[dict] = Field(default_factory=list)  # trials run first, {key: value} each
    params: dict  # key -> search space in Hydra's sweep syntax


class StartsFrom(Settings):
    """The run an experiment continues: `make reproduce` runs `experiment` first and passes its run's
    checkpoints/last.ckpt as `checkpoint_key`."""

    described_as: ClassVar[str] = "expected_scores.starts_from"

    experiment: str
    checkpoint_key: str


class ExpectedScores(Settings):
    """An experiment's pinned results (`make reproduce`, research/expected_scores.py)."""

    described_as: ClassVar[str] = "expected_scores"

    tolerance: float = 0.5
    scores: dict[str, float]
    starts_from: StartsFrom | None = None


class TrainSettings(CommandSettings):
    described_as: ClassVar[str] = "train.py's config"

    task_name: str
    data_root: str | None
    output_dir: str
    seed: Seed
    eval_every_n_steps: AtLeastOne
    ckpt_path: str | None
    resume: bool
    overwrite: bool = False
    export_dir: str | None
    paths: RunPaths
    backbone: dict  # training reads `name_or_path` alone (through `model.model_name_or_path`)
    template: TemplateSettings
    extras: Extras = Extras()
    hparams_search: OptunaSearch | None = None  # an Optuna search (training/optuna_search.py)
    expected_scores: ExpectedScores | None = None  # read by `make reproduce` from the experiment's file
    model: dict
    optimizer: dict
    scheduler: dict
    data: dict
    trainer: dict
    callbacks: dict
    logger: dict | None = None
    resolved: dict  # every value, recorded with the results and logged as the W&B run config

    @property
    def recipe(self) -> str | None:
        """The LightningModule's class path (`model._target_`)."""
        return self.model.get("_target_")

    @property
    def backbone_name(self) -> str:
        """The model training starts from (`model.model_name_or_path`, which the backbone group sets)."""
        return str(self.model["model_name_or_path"])

    @model_validator(mode="before")
    @classmethod
    def record(cls, values: dict) -> dict:
        return {**values, "resolved": values} if isinstance(values, dict) else values

    @model_validator(mode="after")
    def check(self, info: ValidationInfo) -> TrainSettings:
        """After pydantic's types and keys, the cheapest refutations first, so that a typical mistake is answered
        before the training stack is imported: the optimiser and schedule against their hints, the data root; then
        what the values say about each other (`check_train_composition`: every `_target_` node, the recipe's
        template and registration), then the machine, the model files and the training data files (one
        `ConfigError` line each)."""
        declare_optimizer_hints()
        for prefix, values, target in target_nodes({"optimizer": self.optimizer, "scheduler": self.scheduler}):
            if callable(target):
                check_node(prefix, values, target)
        if not composition_only(info.context):
            resolve_data_root(self.data_root)
        check_train_composition(self.resolved)
        if composition_only(info.context):
            return self
        from promptemb.common.device_profile import check_clipping
        from promptemb.common.validation import check_accelerator
        from promptemb.encoder.loading import check_model_source
        from promptemb.lightning_modules.grad_cache import check_grad_cache_precision
        from promptemb.training.trainer import check_compile

        trainer, model = self.trainer, self.model
        check_accelerator("trainer.accelerator", trainer.get("accelerator"), trainer.get("devices"))
        check_compile(bool(trainer.get("compile")), trainer.get("accelerator"))
        check_grad_cache_precision(trainer.get("precision"), model.get("grad_cache_chunk_size"))
        check_clipping(trainer.get("precision"), trainer.get("gradient_clip_val"), self.optimizer)
        recipe = target_of(model)
        if hasattr(recipe, "check_config"):
            recipe.check_config(model)
        if trainer.get("compile") and hasattr(recipe, "check_compile"):
            recipe.check_compile(model)
        if isinstance(model.get("model_name_or_path"), str):
            check_model_source(model["model_name_or_path"])
        check_training_data(self.data, resolve_data_root(self.data_root))
        if hasattr(recipe, "check_training_data"):  # what the recipe's loss needs from the data (e.g. gold scores)
            recipe.check_training_data(self.data, resolve_data_root(self.data_root))
        check_writable_dir("output_dir", self.output_dir)
        if self.export_dir:
            check_writable_dir("export_dir", Path(self.export_dir).parent)
        return self


def declare_optimizer_hints() -> None:
    """torch's AdamW (configs/optimizer/) takes any float; a run needs a positive rate and a non-negative decay."""
    import torch

    declare_hints(torch.optim.AdamW, lr=Positive, weight_decay=NonNegative)


def check_train_composition(values: dict) -> None:
    """What a resolved train.py config must satisfy whatever the machine: every `_target_` node against its
    constructor, a registered recipe (its checkpoints must load) and a template it can train with."""
    from promptemb.encoder.settings import check_backbone, check_template
    from promptemb.lightning_modules.recipe import require_registered

    check_template(values, (values.get("model") or {}).get("_target_"))
    check_node_maps(values, "callbacks", "logger")
    check_targets(values)
    if (recipe := target_of(values.get("model") or {})) is not None:
        require_registered(recipe)
    check_backbone(values)
    for node in (values.get("callbacks") or {}).values():  # a callback's own check (the STS callback's scoring keys)
        owner = getattr(target := target_of(node or {}), "__self__", target)
        if hasattr(owner, "check_config"):
            owner.check_config(node)
    check_selection_metric(values.get("callbacks") or {})  # after the callback's own check: its dev task exists


def check_selection_metric(callbacks: dict) -> None:
    """Checkpoint selection monitors (and names its files by) a dev score the STS callback logs: another `dev_task`
    logs under another name, and Lightning would only warn while no best checkpoint is kept."""
    from promptemb.callbacks.sts_evaluation import EvaluationPlan, dev_metric

    sts, selection = callbacks.get("sts_evaluation") or {}, callbacks.get("model_checkpoint") or {}
    logged = dev_metric(sts.get("dev_task", EvaluationPlan.dev_task), "")
    read = [selection.get("monitor"), *re.findall(r"\{(val/[^:}]+)", str(selection.get("filename", "")))]
    for metric in (m for m in read if sts and isinstance(m, str) and m.startswith("val/")):
        if not metric.startswith(logged):
            raise ConfigError(f"callbacks.model_checkpoint reads {metric}, which is never logged: with dev_task="
                              f"{sts.get('dev_task')} the STS callback logs {logged}<pooler>; set its monitor "
                              f"(and filename) to {logged}mask")


def check_training_data(data: dict, root: Path) -> None:
    """The datamodule's own check of its corpus files, without building it (`check_files`)."""
    if hasattr(target := target_of(data), "check_files"):
        target.check_files({"data_root": str(root), **data})
