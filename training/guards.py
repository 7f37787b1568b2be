"""What wraps the body of `train(cfg)` (training/runner.py), lightning-hydra-template's `task_wrapper` split in two
context managers, so that `train` itself only instantiates and calls `trainer.fit`:

* `run_folder(cfg)`, before anything loads: the config check (once per command), the extras, the data root, the
  run-folder refusals (`preflight`: the checkpoint, its lineage, the folder's owner), the export folder, the
  folder's lock (held until the block ends) and the loggers. A refusal here leaves the folder exactly as it was.
  It yields the `Run`: the checkpoint to resume from, the lineage, the loggers;
* `Run.fitting(trainer)`, around `trainer.fit`: SIGTERM and Ctrl-C become one line saying how to resume, out of
  memory becomes one line, W&B is finished with the run's exit code, and the DDP ranks that fit starts inherit the
  run folder.

The trial record (status.json, the failed-run policy, sweeps) wraps `train(cfg)` from outside: training/trials.py.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import Logger, WandbLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from promptemb.callbacks.wandb_run import WandbRunCallback
from promptemb.common.errors import ConfigError, PreemptedError
from promptemb.data.root import resolve_data_root
from promptemb.exporting.runner import check_out, export_checkpoint
from promptemb.training.config_checks import check_train_config_once
from promptemb.training.lineage import LineageCallback, run_lineage
from promptemb.training.loggers import build_loggers, finish_wandb
from promptemb.training.memory import out_of_memory_is_one_line
from promptemb.training.preflight import preflight
from promptemb.training.rng_state import RandomStateCallback
from promptemb.training.run_dirs import RANK_ZERO_RUN_DIR, resume_hint
from promptemb.training.run_lock import clear_run_folder, first_process_of_job, run_folder_lock
from promptemb.training.trials import RunInterruptedError, before_the_run

log = logging.getLogger(__name__)


def apply_extras(cfg: DictConfig) -> None:
    """configs/extras/: silence warnings, log the composed config."""
    extras = cfg.get("extras") or {}
    if extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))


@dataclass
class Run:
    """A checked run holding its folder: what `train` needs besides the config."""

    cfg: DictConfig
    checkpoint: Path | None  # resumed from, None for a fresh run
    lineage: dict | None  # known when resuming (compared with the checkpoint's), else computed when training starts
    loggers: list[Logger]

    @property
    def ckpt_path(self) -> str | None:
        return str(self.checkpoint) if self.checkpoint else None

    def callbacks(self) -> list[pl.Callback]:
        """What every run adds to the configured callbacks: the RNG state (exact resume: dropout draws continue where
        the checkpoint left them), the lineage a resume of any of its checkpoints must match, the W&B run id."""
        added = [RandomStateCallback(), LineageCallback(functools.partial(run_lineage, self.cfg), self.lineage)]
        if any(isinstance(logger, WandbLogger) for logger in self.loggers):
            added.append(WandbRunCallback())
        return added

    @contextlib.contextmanager
    def fitting(self, trainer: pl.Trainer) -> Iterator[None]:
        """Around `trainer.fit`: preemption, Ctrl-C and out of memory as one line each; W&B finished either way."""
        run_dir = Path(self.cfg.output_dir)
        exit_code = 1
        inherited_run_dir = os.environ.get(RANK_ZERO_RUN_DIR)
        os.environ[RANK_ZERO_RUN_DIR] = str(self.cfg.output_dir)  # the DDP ranks fit() starts inherit this folder
        try:
            try:
                with out_of_memory_is_one_line(self.cfg, trainer):
                    yield
            except SIGTERMException:
                raise PreemptedError(f"preempted (SIGTERM) at step {trainer.global_step}: saved "
                                     f"{trainer.checkpoint_callback.last_model_path}; {resume_hint(run_dir)}"
                                     ) from None
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
            finish_wandb(self.loggers, exit_code)
            if inherited_run_dir is None:
                os.environ.pop(RANK_ZERO_RUN_DIR, None)

    def export(self, trainer: pl.Trainer) -> None:
        """`export_dir`: the best checkpoint exported there (as export.py) once training ended normally."""
        export_dir = self.cfg.get("export_dir")
        if not export_dir or not trainer.is_global_zero or trainer.interrupted:
            return
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        if not best:
            raise ConfigError("export_dir is set but no checkpoint was saved; train for at least eval_every_n_steps")
        log.info("exported %s to %s", best, export_checkpoint(best, export_dir))


@contextlib.contextmanager
def run_folder(cfg: DictConfig) -> Iterator[Run]:
    """Check the run, take its folder (its lock is held until the block ends) and yield it."""
    run_dir = Path(cfg.output_dir)
    export_dir = cfg.get("export_dir")
    with contextlib.ExitStack() as held:
        with before_the_run():  # a refusal here leaves the run folder exactly as it was
            check_train_config_once(cfg)  # types, ranges, devices, paths, weights, data columns: before anything loads
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
        if checks.checkpoint:
            log.info("resuming from %s (step %s) into %s", checks.checkpoint, checks.resumed.get("global_step"),
                     run_dir)
        checks.resumed = None  # only its header was needed; Lightning loads the checkpoint itself
        yield Run(cfg, checks.checkpoint, checks.lineage, loggers)
