"""`train(settings, context)`: instantiate everything from the checked settings and call `trainer.fit`
(lightning-hydra-template's `train`; the final STS scoring happens in the evaluation callback).

The run folder's refusals and lock are a context manager around the body (`run_folder`, training/guards.py); the
trial record, sweeps and the Optuna search wrap `train` from outside (training/command_line.py, training/trials.py,
training/optuna_search.py). From train.py: `train_task(cfg)` -> `train(settings, context)` -> `trainer.fit`."""

from __future__ import annotations

import logging

import pytorch_lightning as pl

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.common.instantiate import build
from promptemb.common.run_context import FROM_PYTHON, RunContext
from promptemb.training.guards import Preflight, run_folder
from promptemb.training.loggers import log_config
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


def train(settings: TrainSettings, context: RunContext = FROM_PYTHON, checks: Preflight | None = None) -> pl.Trainer:
    """Train one run in its folder (`output_dir`) and return the trainer; `checks`: its preflight, when the command
    line ran it before Hydra (`run_folder`)."""
    with run_folder(settings, context, checks) as run:  # resumable, the folder's lock held
        pl.seed_everything(settings.seed, workers=True)
        # _convert_="all": modules get plain lists/dicts, so checkpoints hold no config objects and load with
        # torch.load(weights_only=True).
        datamodule = build(settings.data)
        module = build_module(settings)
        callbacks = [*(build(c) for c in settings.callbacks.values() if c is not None), *run.callbacks()]
        for callback in callbacks:
            if isinstance(callback, STSEvaluationCallback):
                callback.provenance.update(seed=settings.seed, config=settings.resolved,
                                           held_out_tasks=list(getattr(datamodule, "held_out_tasks", ())))
        trainer: pl.Trainer = build(settings.trainer, callbacks=callbacks, logger=run.loggers or False)
        log_config(run.loggers, settings.resolved)
        with run.fitting(trainer):  # SIGTERM, Ctrl-C and out of memory as one line each
            trainer.fit(module, datamodule=datamodule, ckpt_path=run.ckpt_path)
        sts = sts_callback(callbacks)
        if trainer.is_global_zero and sts is not None and (line := sts.summary()):
            log.warning(line) if "WARNING" in line else log.info(line)
        run.export(trainer)
    return trainer
