"""Run folders: where a run writes, which checkpoint `ckpt_path=last` means, and cleaning up after a failed start.

Layout (lightning-hydra-template's): `<log_dir>/<task_name>/runs/<timestamp>` for a single run and
`<log_dir>/<task_name>/multiruns/<timestamp>/<job number>` for each trial of a sweep; timestamps carry microseconds
and every trial has its own numbered folder, so no two runs ever share one. Resuming (`ckpt_path=PATH` of a
`RUN/checkpoints/*.ckpt`, or `ckpt_path=last` / `resume=true` for the newest run of the same task) writes into the
checkpoint's own run folder, where its curve, metrics.csv and best-checkpoint bookkeeping continue.

The `promptemb.run_dir` resolver computes `output_dir` (and so Hydra's run dir) from these rules; it is registered
when this module is imported. (A run that fails before any work leaves no folder: `promptemb.common.validation`.)
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from pytorch_lightning.utilities.rank_zero import rank_zero_only

from promptemb.common.errors import ConfigError
from promptemb.common.hydra_bridge import register_resolver, running_context
from promptemb.common.run_context import RunContext

LAST = "last"


def newest_last_checkpoint(task_dir: Path) -> Path | None:
    """The most recently written `checkpoints/last.ckpt` of any run (or trial) of one task."""
    candidates = [*task_dir.glob("runs/*/checkpoints/last.ckpt"), *task_dir.glob("multiruns/*/*/checkpoints/last.ckpt")]
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def resume_checkpoint(ckpt_path: str | None, resume: bool, task_dir: str | Path,
                      run_folder: str | Path | None = None) -> Path | None:
    """The checkpoint a run resumes from: `ckpt_path` as given, or for `last` / `resume=true` the run folder's own
    `checkpoints/last.ckpt` when `output_dir=` names one, else the newest one of the task; None for a fresh run. A
    `last` with nothing to resume is an error, and so is a named run folder without a last.ckpt (never another run's
    checkpoint resumed into it). `run_folder`: the run's own folder (`output_dir`), None where it has none yet (the
    resolver computing it) or shares `last` with the task (a sweep's trials)."""
    if ckpt_path in (None, "", "null") and not resume:
        return None
    if ckpt_path not in (None, "", "null", LAST):
        return Path(str(ckpt_path))
    found = newest_last_checkpoint(Path(task_dir))
    if run_folder is not None:
        folder = Path(run_folder)
        own = folder / "checkpoints" / "last.ckpt"
        if own.is_file():
            return own
        if found is not None and found.parent.parent.resolve() != folder.resolve():
            raise ConfigError(f"nothing to resume in {folder}: it has no checkpoints/last.ckpt; drop ckpt_path/resume "
                              "for a fresh run, or pass ckpt_path=PATH of the checkpoint to resume")
    if found is None:
        raise ConfigError(f"nothing to resume: no run under {task_dir} has checkpoints/last.ckpt; start a fresh run "
                          "(drop ckpt_path/resume) or pass ckpt_path=PATH")
    return found


#: Set by a training run for the DDP ranks Lightning starts as new processes: they compose the same config, and
#: must write into the run folder of rank 0, not resolve a timestamped folder of their own.
RANK_ZERO_RUN_DIR = "PROMPTEMB_RANK_ZERO_RUN_DIR"


def is_global_rank_zero() -> bool:
    """Whether this process keeps the run's records (Lightning's global rank; 0 outside distributed training)."""
    return getattr(rank_zero_only, "rank", 0) == 0


def run_dir(ckpt_path: str | None, resume: bool, task_dir: str, stamp: str) -> str:
    """`output_dir`'s default: rank 0's folder in a DDP rank it started, the resumed checkpoint's run folder, this
    trial's folder in a sweep, else a new timestamped folder."""
    if os.environ.get(RANK_ZERO_RUN_DIR):
        return os.environ[RANK_ZERO_RUN_DIR]
    if (job := running_context()).multirun:
        return str(job.job_dir)
    try:
        checkpoint = resume_checkpoint(ckpt_path, bool(resume), task_dir)
    except ConfigError:  # reported by train.py with its one line; Hydra needs some folder meanwhile
        checkpoint = None
    if checkpoint is not None and checkpoint.parent.name == "checkpoints":
        return str(checkpoint.parent.parent)
    return str(Path(task_dir) / "runs" / stamp)


def resume_command(output_dir: str | Path, checkpoint: str | Path, overrides: tuple[str, ...]) -> str:
    """The command line that resumes this run from `checkpoint` into its own folder: this process's command with
    the run's `overrides` and `ckpt_path`, `resume` and `output_dir` set explicitly (a sweep's trial resumes as a
    single run)."""
    program = sys.argv[0] if sys.argv and sys.argv[0] else "train.py"
    python = "python" if shutil.which("python") and Path(shutil.which("python")).resolve() == Path(
        sys.executable).resolve() else sys.executable
    head = [python, program] if program.endswith(".py") else [program]
    flags = [arg for arg in sys.argv[1:] if arg.startswith("-") and "=" in arg]  # --config-dir=..., not -m
    replaced = ("ckpt_path", "resume", "output_dir", "hparams_search")  # a study's trial resumes as a single run
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in replaced]
    return shlex.join([*head, *flags, *kept, f"output_dir={Path(output_dir).resolve()}",
                       f"ckpt_path={Path(checkpoint).resolve()}"])


def resume_hint(output_dir: str | Path, context: RunContext) -> str:
    """How to continue a stopped run: the exact command when it has saved `last.ckpt`."""
    last = Path(output_dir) / "checkpoints" / "last.ckpt"
    if last.is_file():
        return f"resume with: {resume_command(output_dir, last, context.overrides)}"
    return "no checkpoint was saved, so there is nothing to resume: start the run again"


register_resolver("promptemb.run_dir", run_dir)
