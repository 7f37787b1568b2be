"""The refusals that come before a run touches its folder, run twice: on the command line before Hydra composes the
job (Hydra writes `.hydra/` and opens the log in the run folder before any task code runs, so a refused resume or a
second run on a live folder would otherwise rewrite the other run's config), and again in `train()` (which tests,
sweeps and Optuna trials call directly; the folder may have changed meanwhile). The config check before them runs
once per command: `train()` skips a config the command line has just checked.

* `ckpt_path` names a readable train.py checkpoint that holds the optimizer state (or `last` finds one);
* the checkpoint's lineage matches this config (`training/lineage.py`);
* the folder is not held by a live run, and holds no other run unless this resumes it (`training/run_lock.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from promptemb.common.cli import compose_config
from promptemb.lightning_modules.checkpoint import read_checkpoint
from promptemb.training.checkpointing import check_resumable
from promptemb.training.config_checks import check_train_config
from promptemb.training.lineage import check_lineage, run_lineage
from promptemb.training.run_dirs import in_multirun, resume_checkpoint
from promptemb.training.run_lock import check_run_folder, first_process_of_job


@dataclass
class Preflight:
    checkpoint: Path | None  # the checkpoint to resume from, None for a fresh run
    resumed: dict | None  # its contents (memory-mapped: only the header is read)
    lineage: dict | None  # this run's, when resuming (compared with the checkpoint's); written into every checkpoint


def preflight(cfg: DictConfig) -> Preflight:
    """Every refusal of a checked config that must come before the run writes anything (one-line UserErrors)."""
    # the run's own folder: `output_dir=DIR ckpt_path=last` resumes DIR's last.ckpt before Hydra starts too (a
    # sweep's trials keep resolving `last` to the newest run of the task)
    checkpoint = resume_checkpoint(cfg.ckpt_path, bool(cfg.get("resume", False)),
                                   Path(cfg.paths.log_dir) / cfg.task_name,
                                   run_folder=None if in_multirun() else cfg.output_dir)
    # a missing, damaged or foreign checkpoint: one line now, not a traceback from Lightning
    resumed = read_checkpoint(checkpoint, argument="ckpt_path") if checkpoint else None
    lineage = run_lineage(cfg) if checkpoint else None  # a fresh run computes it when training starts
    if checkpoint:
        check_resumable(checkpoint, resumed)
        check_lineage(checkpoint, resumed, lineage)
    if first_process_of_job():  # the other ranks of a DDP job run in the folder their first process holds
        check_run_folder(cfg.output_dir, checkpoint, bool(cfg.get("overwrite", False)))
    return Preflight(checkpoint, resumed, lineage)


def check_run_before_hydra(argv: list[str]) -> None:
    """train.py's command line: the preflight refusals before Hydra touches an existing run folder. A fresh run into
    a new folder has nothing to protect (its checks run in `train()`); flags (-m, --cfg, ...) are left to Hydra and
    each trial of a sweep has a folder of its own."""
    if any(arg.startswith("-") for arg in argv) or not first_process_of_job():
        return
    try:
        cfg = compose_config("train", argv)
        resuming = cfg.ckpt_path not in (None, "", "null") or bool(cfg.get("resume", False))
        exists = Path(cfg.output_dir).exists()
    except Exception:  # overrides that do not compose: Hydra reports them
        return
    if resuming or exists:
        check_train_config(cfg, remember=True)  # not checked again in train(): one check per command
        preflight(cfg)

