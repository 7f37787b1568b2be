"""Instantiate everything from the composed config and fit (final STS scoring happens in the callback)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytorch_lightning as pl
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from callbacks.sts_evaluation import STSEvaluationCallback
from common.errors import ConfigError, UserError
from data.root import resolve_data_root
from exporting.runner import check_out, export_checkpoint

log = logging.getLogger(__name__)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def experiment_names() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def check_experiment_overrides(argv: list[str]) -> None:
    """Fail with one line listing the valid names when `experiment=NAME` names no config."""
    for arg in argv:
        if arg.lstrip("+").startswith("experiment="):
            name = arg.split("=", 1)[1]
            if name not in experiment_names():
                raise ConfigError(f"unknown experiment {name!r}; valid experiments: {', '.join(experiment_names())}")


def build(node, **kwargs):
    """`hydra.utils.instantiate` with `_convert_="all"`; a user mistake raised inside a constructor comes out as
    that one-line `UserError`, not wrapped in Hydra's multi-line InstantiationException."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        while cause is not None and not isinstance(cause, UserError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


def train(cfg: DictConfig) -> pl.Trainer:
    pl.seed_everything(int(cfg.seed), workers=True)
    resolve_data_root(cfg.data_root)  # evaluation needs it; fail before loading any model
    export_dir = cfg.get("export_dir")
    if export_dir:
        check_out(Path(export_dir), overwrite=False)  # fail before training, not after
    # _convert_="all": modules get plain lists/dicts, so checkpoints hold no OmegaConf objects and load with
    # torch.load(weights_only=True).
    datamodule = build(cfg.data)
    module = build(cfg.module)
    callbacks = [build(c) for c in cfg.callbacks.values() if c is not None]
    for callback in callbacks:
        if isinstance(callback, STSEvaluationCallback):
            callback.provenance.update(seed=int(cfg.seed), config=OmegaConf.to_container(cfg, resolve=True),
                                       held_out_tasks=list(getattr(datamodule, "held_out_tasks", ())))
    logger = build(cfg.logger) if cfg.get("logger") else False
    trainer: pl.Trainer = build(cfg.trainer, callbacks=callbacks, logger=logger)
    if cfg.ckpt_path and not Path(cfg.ckpt_path).is_file():
        raise ConfigError(f"checkpoint {cfg.ckpt_path} does not exist; pass ckpt_path=PATH of a saved .ckpt")
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    if export_dir and trainer.is_global_zero and not trainer.interrupted:
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        if not best:
            raise ConfigError("export_dir is set but no checkpoint was saved; train for at least eval_every_n_steps")
        log.info("exported %s to %s", best, export_checkpoint(best, export_dir))
    return trainer
