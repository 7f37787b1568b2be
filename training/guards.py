"""What wraps the body of `train(settings, context)` (training/runner.py), lightning-hydra-template's `task_wrapper`
split in two context managers, so that `train` itself only instantiates and calls `trainer.fit`:

* `run_folder(settings, context)`, before anything loads: the extras, the data root, the refusals that must come
  before the run writes anything (`preflight`: the checkpoint, its lineage, the folder's owner), the export folder,
  the folder's lock (held until the block ends) and the loggers. A refusal here leaves the folder exactly as it was.
  It yields the `Run`: the checkpoint to resume from, the lineage, the loggers;
* `Run.fitting(trainer)`, around `trainer.fit`: SIGTERM and Ctrl-C become one line saying how to resume, out of
  memory becomes one line, W&B is finished with the run's exit code, and the DDP ranks that fit starts inherit the
  run folder.

The preflight runs once per run: here, or for a resume or a run into an existing folder on train.py's command line
before Hydra composes the job (Hydra writes `.hydra/` and opens the log in the run folder before any task code runs,
so a refused resume or a second run on a live folder would otherwise rewrite the other run's config), which hands it
to `train` (`checks`); the folder's lock, taken here either way, is what keeps a live run out. The trial record
(status.json, the failed-run policy, sweeps) wraps `train` from outside: training/trials.py.
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
import yaml
from pytorch_lightning.loggers import Logger, WandbLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from promptemb.callbacks.wandb_run import WandbRunCallback
from promptemb.common.errors import ConfigError, PreemptedError
from promptemb.common.run_context import RunContext
from promptemb.data.root import resolve_data_root
from promptemb.exporting.runner import check_out, export_checkpoint
from promptemb.lightning_modules.checkpoint import read_checkpoint
from promptemb.training.checkpointing import check_resumable
from promptemb.training.lineage import LineageCallback, check_lineage, run_lineage
from promptemb.training.loggers import build_loggers, finish_wandb
from promptemb.training.memory import out_of_memory_is_one_line
from promptemb.training.rng_state import RandomStateCallback
from promptemb.training.run_dirs import RANK_ZERO_RUN_DIR, resume_checkpoint, resume_hint
from promptemb.training.run_lock import check_run_folder, clear_run_folder, first_process_of_job, run_folder_lock
from promptemb.training.settings import TrainSettings
from promptemb.training.trials import RunInterruptedError, before_the_run

log = logging.getLogger(__name__)


@dataclass
class Preflight:
    checkpoint: Path | None  # the checkpoint to resume from, None for a fresh run
    resumed: dict | None  # its contents (memory-mapped: only the header is read)
    lineage: dict | None  # this run's, when resuming (compared with the checkpoint's); written into every checkpoint


def preflight(settings: TrainSettings, context: RunContext) -> Preflight:
    """Every refusal of checked settings that must come before the run writes anything (one-line UserErrors):
    `ckpt_path` names a readable train.py checkpoint that holds the optimizer state (or `last` finds one); its
    lineage matches these settings (training/lineage.py); the folder is not held by a live run, and holds no other
    run unless this resumes it (training/run_lock.py)."""
    # the run's own folder: `output_dir=DIR ckpt_path=last` resumes DIR's last.ckpt (a sweep's trials keep resolving
    # `last` to the newest run of the task)
    checkpoint = resume_checkpoint(settings.ckpt_path, settings.resume,
                                   Path(settings.paths.log_dir) / settings.task_name,
                                   run_folder=None if context.multirun else settings.output_dir)
    # a missing, damaged or foreign checkpoint: one line now, not a traceback from Lightning
    resumed = read_checkpoint(checkpoint, argument="ckpt_path") if checkpoint else None
    lineage = run_lineage(settings) if checkpoint else None  # a fresh run computes it when training starts
    if checkpoint:
        check_resumable(checkpoint, resumed)
        check_lineage(checkpoint, resumed, lineage)
    if first_process_of_job():  # the other ranks of a DDP job run in the folder their first process holds
        check_run_folder(settings.output_dir, checkpoint, settings.overwrite)
    return Preflight(checkpoint, resumed, lineage)


def apply_extras(settings: TrainSettings) -> None:
    """configs/extras/: silence warnings, log the composed config."""
    if settings.extras.ignore_warnings:
        warnings.filterwarnings("ignore")
    if settings.extras.print_config:
        log.info("config:\n%s", yaml.safe_dump(settings.resolved, sort_keys=False))


@dataclass
class Run:
    """A checked run holding its folder: what `train` needs besides the settings."""

    settings: TrainSettings
    context: RunContext
    checkpoint: Path | None  # resumed from, None for a fresh run
    lineage: dict | None  # known when resuming (compared with the checkpoint's), else computed when training starts
    loggers: list[Logger]

    @property
    def ckpt_path(self) -> str | None:
        return str(self.checkpoint) if self.checkpoint else None

    def callbacks(self) -> list[pl.Callback]:
        """What every run adds to the configured callbacks: the RNG state (exact resume: dropout draws continue where
        the checkpoint left them), the lineage a resume of any of its checkpoints must match, the W&B run id."""
        added = [RandomStateCallback(), LineageCallback(functools.partial(run_lineage, self.settings), self.lineage)]
        if any(isinstance(logger, WandbLogger) for logger in self.loggers):
            added.append(WandbRunCallback())
        return added

    @contextlib.contextmanager
    def fitting(self, trainer: pl.Trainer) -> Iterator[None]:
        """Around `trainer.fit`: preemption, Ctrl-C and out of memory as one line each; W&B finished either way."""
        run_dir = Path(self.settings.output_dir)
        exit_code = 1
        inherited_run_dir = os.environ.get(RANK_ZERO_RUN_DIR)
        os.environ[RANK_ZERO_RUN_DIR] = str(run_dir)  # the DDP ranks fit() starts inherit this folder
        try:
            try:
                with out_of_memory_is_one_line(trainer):
                    yield
            except SIGTERMException:
                raise PreemptedError(f"preempted (SIGTERM) at step {trainer.global_step}: saved "
                                     f"{trainer.checkpoint_callback.last_model_path}; "
                                     f"{resume_hint(run_dir, self.context)}") from None
            except SystemExit:
                if not trainer.interrupted:
                    raise
                # Lightning's answer to Ctrl-C: it ignores SIGINT from then on and exits; this process goes on (to
                # record the run), so Ctrl-C works again and the exit becomes one line
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise RunInterruptedError(f"interrupted (Ctrl-C) at step {trainer.global_step}; "
                                          f"{resume_hint(run_dir, self.context)}") from None
            exit_code = 0
        finally:
            finish_wandb(self.loggers, exit_code)
            if inherited_run_dir is None:
                os.environ.pop(RANK_ZERO_RUN_DIR, None)

    def export(self, trainer: pl.Trainer) -> None:
        """`export_dir`: the best checkpoint exported there (as export.py) once training ended normally."""
        export_dir = self.settings.export_dir
        if not export_dir or not trainer.is_global_zero or trainer.interrupted:
            return
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        if not best:
            raise ConfigError("export_dir is set but no checkpoint was saved; train for at least eval_every_n_steps")
        log.info("exported %s to %s", best, export_checkpoint(best, export_dir))


@contextlib.contextmanager
def run_folder(settings: TrainSettings, context: RunContext, checks: Preflight | None = None) -> Iterator[Run]:
    """Take the run's folder (its lock is held until the block ends) and yield the run; `checks`: the preflight
    train.py's command line ran before Hydra wrote into an existing folder (else it runs here)."""
    run_dir = Path(settings.output_dir)
    with contextlib.ExitStack() as held:
        with before_the_run():  # a refusal here leaves the run folder exactly as it was
            apply_extras(settings)
            resolve_data_root(settings.data_root)  # evaluation needs it; fail before loading any model
            checks = checks or preflight(settings, context)  # the checkpoint, its lineage, the folder's owner
            if settings.export_dir:
                check_out(Path(settings.export_dir), overwrite=False)  # fail before training, not after
            held.enter_context(run_folder_lock(run_dir))  # from here on no other run enters the folder
            # W&B: credentials checked and the resumed run id taken from the checkpoint before any run is created.
            loggers = build_loggers(settings.logger, checks.resumed)
        if settings.overwrite and first_process_of_job():
            clear_run_folder(run_dir)
        if checks.checkpoint:
            log.info("resuming from %s (step %s) into %s", checks.checkpoint, checks.resumed.get("global_step"),
                     run_dir)
        checks.resumed = None  # only its header was needed; Lightning loads the checkpoint itself
        yield Run(settings, context, checks.checkpoint, checks.lineage, loggers)
