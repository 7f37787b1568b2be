"""train.py's config, checked once before any model or corpus is loaded: its own keys (`TrainSettings`), every
`_target_` node against its constructor, the template against the recipe, the machine (accelerator, devices), the
model files and the training data files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from omegaconf import DictConfig
from pydantic import BaseModel

from promptemb.common.bounds import AtLeastOne, Seed
from promptemb.common.device_profile import check_clipping
from promptemb.common.errors import ConfigError
from promptemb.common.run_folder import nothing_left_on_user_error
from promptemb.common.validation import (
    check_accelerator,
    check_settings,
    check_targets,
    check_writable_dir,
    resolved,
    target_of,
)
from promptemb.data.root import resolve_data_root
from promptemb.encoder.loading import check_model_source
from promptemb.encoder.settings import check_backbone, check_template
from promptemb.lightning_modules.grad_cache import check_grad_cache_precision
from promptemb.training.trainer import check_compile


class TrainSettings(BaseModel):
    """train.py's own top-level keys (the rest are `_target_` nodes)."""

    task_name: str
    data_root: str | None
    output_dir: str
    seed: Seed
    eval_every_n_steps: AtLeastOne
    ckpt_path: str | None
    resume: bool
    export_dir: str | None
    paths: dict
    backbone: dict
    template: dict
    extras: dict | None = None
    hparams_search: dict | None = None
    overwrite: bool = False
    expected_scores: dict | None = None


def _check_train(cfg: DictConfig) -> None:
    container = resolved(cfg)
    check_train_composition(container)
    trainer = container.get("trainer") or {}
    check_accelerator("trainer.accelerator", trainer.get("accelerator"), trainer.get("devices"))
    check_compile(bool(trainer.get("compile")), trainer.get("accelerator"))
    model = container.get("model") or {}
    check_grad_cache_precision(trainer.get("precision"), model.get("grad_cache_chunk_size"))
    check_clipping(trainer.get("precision"), trainer.get("gradient_clip_val"), container.get("optimizer") or {})
    if hasattr(recipe := target_of(model), "check_config"):
        recipe.check_config(model)
    if trainer.get("compile") and hasattr(recipe, "check_compile"):
        recipe.check_compile(model)
    if isinstance(model.get("model_name_or_path"), str):
        check_model_source(model["model_name_or_path"])
    root = resolve_data_root(container.get("data_root"))
    check_training_data(container.get("data") or {}, root)
    check_writable_dir("output_dir", container["output_dir"])
    if container.get("export_dir"):
        check_writable_dir("export_dir", Path(container["export_dir"]).parent)


def check_train_composition(container: dict) -> None:
    """What a resolved train.py config must satisfy whatever the machine: types and ranges of every key, and a
    template the recipe can train with."""
    check_template(container, (container.get("model") or {}).get("_target_"))
    check_settings(container, TrainSettings)
    check_targets(container)
    check_backbone(container)


def check_training_data(data: dict, root: Path) -> None:
    """The datamodule's own check of its corpus files, without building it (`check_files`)."""
    if hasattr(target := target_of(data), "check_files"):
        target.check_files({"data_root": str(root), **data})


def check_train_config(cfg: DictConfig, remember: bool = False) -> None:
    """Everything about a train.py config that can be refuted before a model or a corpus is loaded. `remember`:
    train.py's command line checks before Hydra composes the same config again for `train()`, which then does not
    check it a second time (`check_train_config_once`)."""
    with nothing_left_on_user_error():
        _check_train(cfg)
    if remember:
        _CHECKED_BEFORE_HYDRA.add(config_digest(cfg))


#: Digests of the resolved configs train.py's command line has checked in this process, each taken once by `train()`.
_CHECKED_BEFORE_HYDRA: set[str] = set()


def config_digest(cfg: DictConfig) -> str:
    return hashlib.sha256(json.dumps(resolved(cfg), sort_keys=True, default=str).encode()).hexdigest()


def check_train_config_once(cfg: DictConfig) -> None:
    """`train()`'s check: skipped when the command line has just checked this very config (the same resolved
    values), so each command checks its config once; a config that differs in any value is checked."""
    try:
        digest = config_digest(cfg)
    except ConfigError:  # does not resolve: the check says so in its own words
        digest = None
    if digest in _CHECKED_BEFORE_HYDRA:
        _CHECKED_BEFORE_HYDRA.discard(digest)
        return
    check_train_config(cfg)
