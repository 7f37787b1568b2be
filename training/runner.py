"""Instantiate everything from the composed config and fit (final STS scoring happens in the callback)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import warnings
from pathlib import Path

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.callbacks.wandb_run import WandbRunCallback
from promptemb.common.errors import ConfigError, PreemptedError
from promptemb.common.instantiate import build
from promptemb.data.root import resolve_data_root
from promptemb.exporting.runner import check_out, export_checkpoint
from promptemb.training.config_checks import check_train_config
from promptemb.training.lineage import LineageCallback, run_lineage
from promptemb.training.loggers import build_loggers, finish_wandb, log_config
from promptemb.training.memory import out_of_memory_is_one_line
from promptemb.training.optuna_search import run_study
from promptemb.training.preflight import Preflight, preflight
from promptemb.training.rng_state import RandomStateCallback
from promptemb.training.run_dirs import RANK_ZERO_RUN_DIR, in_multirun, resume_hint
from promptemb.training.run_lock import clear_run_folder, first_process_of_job, run_folder_lock
from promptemb.training.trials import RunInterruptedError, before_the_run, run_trial

log = logging.getLogger(__name__)


def build_module(cfg: DictConfig) -> pl.LightningModule:
    """The recipe (`model`) with the configured optimiser and schedule (`optimizer`, `scheduler`: Hydra partials)."""
    return build(cfg.model, optimizer=build(cfg.optimizer), scheduler=build(cfg.scheduler))


def best_dev_score(trainer: pl.Trainer) -> float | None:
    """The monitored dev score of the best checkpoint (= the last `val/stsb_dev/mask_best`); without one (training
    ended before the first evaluation after step 0), the untrained model's step-0 score, so the objective exists."""
    best = getattr(trainer.checkpoint_callback, "best_model_score", None)
    if best is not None:
        return float(best)
    callback = next((c for c in trainer.callbacks if isinstance(c, STSEvaluationCallback)), None)
    return callback.best_selection_score(include_untrained=True) if callback else None


def objective(cfg: DictConfig) -> float | None:
    return best_dev_score(train(cfg))


def apply_extras(cfg: DictConfig) -> None:
    """configs/extras/: silence warnings, log the composed config."""
    extras = cfg.get("extras") or {}
    if extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))


def run(cfg: DictConfig) -> float | None:
    """train.py's task: an Optuna search when `hparams_search` is set, else one run (a trial when under -m).
    Returns the objective, the best STS-B dev [MASK] score (for Hydra's sweepers)."""
    if cfg.get("hparams_search"):
        return run_study(cfg, objective)
    return run_trial(cfg, objective, in_sweep=in_multirun()).objective


def train(cfg: DictConfig) -> pl.Trainer:
    run_dir = Path(cfg.output_dir)
    export_dir = cfg.get("export_dir")
    with contextlib.ExitStack() as held:
        with before_the_run():  # a refusal here leaves the run folder exactly as it was
            check_train_config(cfg)  # types, ranges, devices, paths, weights, data columns: before anything loads
            apply_extras(cfg)
            resolve_data_root(cfg.data_root)  # evaluation needs it; fail before loading any model
            checks = preflight(cfg)  # the checkpoint, its lineage, the folder's owner
            if export_dir:
                check_out(Path(export_dir), overwrite=False)  # fail before training, not after
            held.enter_context(run_folder_lock(run_dir))  # from here on no other run enters the folder
            # W&B: credentials checked and the resumed run id taken from the checkpoint before any run is created.
            loggers = build_loggers(cfg.get("logger"), checks.resumed)
        if cfg.get("overwrite") and first_process_of_job():
            clear_run_folder(run_dir)
        return fit(cfg, checks, loggers, export_dir)


def fit(cfg: DictConfig, checks: Preflight, loggers: list, export_dir: str | None) -> pl.Trainer:
    """The run itself, in the folder `train` holds."""
    checkpoint, run_dir = checks.checkpoint, Path(cfg.output_dir)
    if checkpoint:
        log.info("resuming from %s (step %s) into %s", checkpoint, checks.resumed.get("global_step"), run_dir)
    checks.resumed = None  # only its header was needed; Lightning loads the checkpoint itself
    pl.seed_everything(int(cfg.seed), workers=True)
    # _convert_="all": modules get plain lists/dicts, so checkpoints hold no OmegaConf objects and load with
    # torch.load(weights_only=True).
    datamodule = build(cfg.data)
    module = build_module(cfg)
    callbacks = [build(c) for c in cfg.callbacks.values() if c is not None]
    callbacks.append(RandomStateCallback())  # exact resume: dropout draws continue where the checkpoint left them
    # what a resume of any of its checkpoints must match
    callbacks.append(LineageCallback(functools.partial(run_lineage, cfg), checks.lineage))
    for callback in callbacks:
        if isinstance(callback, STSEvaluationCallback):
            callback.provenance.update(seed=int(cfg.seed), config=OmegaConf.to_container(cfg, resolve=True),
                                       held_out_tasks=list(getattr(datamodule, "held_out_tasks", ())))
    if any(isinstance(lg, WandbLogger) for lg in loggers):
        callbacks.append(WandbRunCallback())
    trainer: pl.Trainer = build(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    log_config(loggers, cfg)
    exit_code = 1
    inherited_run_dir = os.environ.get(RANK_ZERO_RUN_DIR)
    os.environ[RANK_ZERO_RUN_DIR] = str(cfg.output_dir)  # the DDP ranks fit() starts inherit this run's folder
    try:
        try:
            with out_of_memory_is_one_line(cfg, trainer):
                trainer.fit(module, datamodule=datamodule, ckpt_path=str(checkpoint) if checkpoint else None)
        except SIGTERMException:
            raise PreemptedError(f"preempted (SIGTERM) at step {trainer.global_step}: saved "
                                 f"{trainer.checkpoint_callback.last_model_path}; {resume_hint(run_dir)}") from None
        except SystemExit:
            if not trainer.interrupted:
                raise
            # Lightning's answer to Ctrl-C: it ignores SIGINT from then on and exits; this process goes on (to
            # record the run), so Ctrl-C works again and the exit becomes one line
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise RunInterruptedError(f"interrupted (Ctrl-C) at step {trainer.global_step}; "
                                 f"{resume_hint(run_dir)}") from None
        exit_code = 0
    finally:
        finish_wandb(loggers, exit_code)
        if inherited_run_dir is None:
            os.environ.pop(RANK_ZERO_RUN_DIR, None)
    sts = next((c for c in callbacks if isinstance(c, STSEvaluationCallback)), None)
    if trainer.is_global_zero and sts is not None and (line := sts.summary()):
        log.warning(line) if "WARNING" in line else log.info(line)
    if export_dir and trainer.is_global_zero and not trainer.interrupted:
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        if not best:
            raise ConfigError("export_dir is set but no checkpoint was saved; train for at least eval_every_n_steps")
        log.info("exported %s to %s", best, export_checkpoint(best, export_dir))
    return trainer
