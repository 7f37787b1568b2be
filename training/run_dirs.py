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
from pathlib import Path

from omegaconf import OmegaConf
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from promptemb.common.errors import ConfigError

LAST = "last"


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def newest_last_checkpoint(task_dir: Path) -> Path | None:
    """The most recently written `checkpoints/last.ckpt` of any run (or trial) of one task."""
    candidates = [*task_dir.glob("runs/*/checkpoints/last.ckpt"), *task_dir.glob("multiruns/*/*/checkpoints/last.ckpt")]
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def resume_checkpoint(ckpt_path: str | None, resume: bool, task_dir: str | Path) -> Path | None:
    """The checkpoint a run resumes from: `ckpt_path` as given, or for `last` / `resume=true` the newest one of the
    task; None for a fresh run. A `last` with nothing to resume is an error."""
    if ckpt_path in (None, "", "null") and not resume:
        return None
    if ckpt_path not in (None, "", "null", LAST):
        return Path(str(ckpt_path))
    found = newest_last_checkpoint(Path(task_dir))
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
    if in_multirun():
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.output_dir
    try:
        checkpoint = resume_checkpoint(ckpt_path, bool(resume), task_dir)
    except ConfigError:  # reported by train.py with its one line; Hydra needs some folder meanwhile
        checkpoint = None
    if checkpoint is not None and checkpoint.parent.name == "checkpoints":
        return str(checkpoint.parent.parent)
    return str(Path(task_dir) / "runs" / stamp)


OmegaConf.register_new_resolver("promptemb.run_dir", run_dir, replace=True)
