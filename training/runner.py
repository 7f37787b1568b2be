"""`train(settings, context)`: instantiate everything from the checked settings and call `trainer.fit`
(lightning-hydra-template's `train`; the final STS scoring happens in the evaluation callback).

The run's folder is taken first (training/run_folder.py: the refusals that come before anything is written, the
lock, the loggers), unless the command line took it before Hydra's job (`taken`); around `trainer.fit`, SIGTERM,
Ctrl-C and out of memory become one line each. From train.py: training/command_line.py -> `train` -> `trainer.fit`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import warnings
from collections.abc import Iterator

import pytorch_lightning as pl
import yaml
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.callbacks.wandb_run import WandbRunCallback
from promptemb.common.errors import ConfigError, PreemptedError
from promptemb.common.instantiate import build
from promptemb.common.run_context import FROM_PYTHON, RunContext
from promptemb.exporting.runner import export_checkpoint
from promptemb.training import run_folder
from promptemb.training.lineage import LineageCallback, run_lineage
from promptemb.training.loggers import finish_wandb, log_config
from promptemb.training.memory import out_of_memory_is_one_line
from promptemb.training.rng_state import RandomStateCallback
from promptemb.training.settings import TrainSettings

log = logging.getLogger(__name__)


def build_module(settings: TrainSettings) -> pl.LightningModule:
    """The recipe (`model`) with the configured optimiser and schedule (`optimizer`, `scheduler`: Hydra partials)."""
    return build(settings.model, optimizer=build(settings.optimizer), scheduler=build(settings.scheduler))


def sts_callback(callbacks: list[pl.Callback]) -> STSEvaluationCallback | None:
    return next((c for c in callbacks if isinstance(c, STSEvaluationCallback)), None)


def best_dev_score(trainer: pl.Trainer) -> float | None:
    """The monitored dev score of the best checkpoint (= the last `val/stsb_dev/mask_best`); without one (training
    ended before the first evaluation after step 0), the untrained model's step-0 score, so the objective exists."""
    best = getattr(trainer.checkpoint_callback, "best_model_score", None)
    if best is not None:
        return float(best)
    callback = sts_callback(trainer.callbacks)
    return callback.best_selection_score(include_untrained=True) if callback else None


def apply_extras(settings: TrainSettings) -> None:
    """configs/extras/: silence warnings, log the composed config."""
    if settings.extras.ignore_warnings:
        warnings.filterwarnings("ignore")
    if settings.extras.print_config:
        log.info("config:\n%s", yaml.safe_dump(settings.resolved, sort_keys=False))


def run_callbacks(settings: TrainSettings, folder: run_folder.TakenFolder) -> list[pl.Callback]:
    """What every run adds to the configured callbacks: the RNG state (exact resume: dropout draws continue where
    the checkpoint left them), the lineage a resume of any of its checkpoints must match, the W&B run id."""
    added = [RandomStateCallback(), LineageCallback(functools.partial(run_lineage, settings), folder.lineage)]
    if any(isinstance(logger, WandbLogger) for logger in folder.loggers):
        added.append(WandbRunCallback())
    return added


@contextlib.contextmanager
def fitting(trainer: pl.Trainer, folder: run_folder.TakenFolder, context: RunContext) -> Iterator[None]:
    """Around `trainer.fit`: preemption, Ctrl-C and out of memory as one line each; W&B finished either way; the DDP
    ranks fit() starts inherit the run folder."""
    exit_code = 1
    inherited = os.environ.get(run_folder.RANK_ZERO_RUN_DIR)
    os.environ[run_folder.RANK_ZERO_RUN_DIR] = str(folder.path)
    try:
        try:
            with out_of_memory_is_one_line(trainer):
                yield
        except SIGTERMException:
            raise PreemptedError(f"preempted (SIGTERM) at step {trainer.global_step}: saved "
                                 f"{trainer.checkpoint_callback.last_model_path}; "
                                 f"{run_folder.resume_hint(folder.path, context)}") from None
        except SystemExit:
            if not trainer.interrupted:
                raise
            # Lightning's answer to Ctrl-C: it ignores SIGINT from then on and exits; this process goes on (to record
            # the run), so Ctrl-C works again and the exit becomes one line
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise run_folder.RunInterruptedError(f"interrupted (Ctrl-C) at step {trainer.global_step}; "
                                                 f"{run_folder.resume_hint(folder.path, context)}") from None
        exit_code = 0
    finally:
        finish_wandb(folder.loggers, exit_code)
        if inherited is None:
            os.environ.pop(run_folder.RANK_ZERO_RUN_DIR, None)


def export_best(settings: TrainSettings, trainer: pl.Trainer) -> None:
    """`export_dir`: the best checkpoint exported there (as export.py) once training ended normally."""
    if not settings.export_dir or not trainer.is_global_zero or trainer.interrupted:
        return
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
    if not best:
        raise ConfigError("export_dir is set but no checkpoint was saved; train for at least eval_every_n_steps")
    log.info("exported %s to %s", best, export_checkpoint(best, settings.export_dir))


def train(settings: TrainSettings, context: RunContext = FROM_PYTHON,
          taken: run_folder.TakenFolder | None = None) -> pl.Trainer:
    """Train one run in its folder (`output_dir`) and return the trainer; `taken`: the folder, when the command line
    took it before Hydra's job."""
    holding = contextlib.nullcontext(taken) if taken else run_folder.take(settings, context)
    with holding as folder:
        apply_extras(settings)
        pl.seed_everything(settings.seed, workers=True)
        # _convert_="all": modules get plain lists/dicts, so checkpoints hold no config objects and load with
        # torch.load(weights_only=True).
        datamodule = build(settings.data)
        module = build_module(settings)
        callbacks = [*(build(c) for c in settings.callbacks.values() if c is not None),
                     *run_callbacks(settings, folder)]
        for callback in callbacks:
            if isinstance(callback, STSEvaluationCallback):
                callback.provenance.update(seed=settings.seed, config=settings.resolved,
                                           held_out_tasks=list(getattr(datamodule, "held_out_tasks", ())))
        trainer: pl.Trainer = build(settings.trainer, callbacks=callbacks, logger=folder.loggers or False)
        log_config(folder.loggers, settings.resolved)
        with fitting(trainer, folder, context):
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(folder.checkpoint) if folder.checkpoint else None)
        sts = sts_callback(callbacks)
        if trainer.is_global_zero and sts is not None and (line := sts.summary()):
            log.warning(line) if "WARNING" in line else log.info(line)
        export_best(settings, trainer)
    return trainer


def run_in_folder(settings: TrainSettings, context: RunContext, taken: run_folder.TakenFolder | None = None,
                  params: dict | None = None) -> float | None:
    """`train` with its outcome recorded in its folder (training/run_folder.py's policy); returns the best STS-B dev
    score, the objective of sweeps."""
    with run_folder.outcome(settings.output_dir, context, params, taken=taken is not None) as result:
        result.objective = best_dev_score(train(settings, context, taken))
    return result.objective

