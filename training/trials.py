"""The end of a sweep (`train.py -m ...` or an Optuna search): one table of every trial with its status and objective
(`summary.md` / `summary.json` in the sweep folder, from each trial's `status.json`: training/run_folder.py), and a
non-zero exit if any trial did not complete. Ctrl-C stops a sweep: the table is written for the trials so far."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from promptemb.common.io import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)
STATUS_FILE = "status.json"
COMPLETED, FAILED, PREEMPTED, INTERRUPTED = "completed", "failed", "preempted", "interrupted"


def summarise(rows: list[dict], folder: Path, title: str) -> int:
    """Print and write (summary.md / summary.json in `folder`) one table of every trial; returns how many failed."""
    lines = [f"# {title}", "", "| trial | status | objective | overrides | reason |", "|---:|---|---:|---|---|"]
    for row in rows:
        objective = f"{row['objective']:.2f}" if row.get("objective") is not None else "-"
        overrides = " ".join(f"{k}={v}" for k, v in row.get("params", {}).items()) or " ".join(row.get("overrides", []))
        lines.append(f"| {row['trial']} | {row['status']} | {objective} | `{overrides}` | {row.get('reason') or ''} |")
    table = "\n".join(lines) + "\n"
    atomic_write_text(folder / "summary.md", table)
    atomic_write_json(folder / "summary.json", {"title": title, "trials": rows})
    print(table, flush=True)
    return sum(row["status"] != COMPLETED for row in rows)


def exit_if_failed(failed: int, total: int, folder: Path) -> None:
    if failed:
        print(f"error: {failed} of {total} trials did not complete; see {folder / 'summary.md'}", file=sys.stderr,
              flush=True)
        sys.exit(1)


class TrialSummary(Callback):
    """Hydra callback (`hydra.callbacks`): after a multirun, the table of every job and a non-zero exit if any
    failed (raised as SystemExit, which Hydra's callback runner lets through)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows, failed = summarise_sweep(sweep_dir)
        if rows:
            exit_if_failed(failed, len(rows), sweep_dir)


def sweep_rows(sweep_dir: Path) -> list[dict]:
    """One row per job folder of a Hydra multirun, from its status.json (a job without one was killed)."""
    rows = []
    for job_dir in sorted((d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit()),
                          key=lambda d: int(d.name)):
        status = job_dir / STATUS_FILE
        row = {"status": FAILED, "reason": "no status.json: the trial was killed", "objective": None}
        if status.is_file():
            row = json.loads(status.read_text(encoding="utf-8"))
        rows.append({"trial": int(job_dir.name), **row})
    return rows


def summarise_sweep(sweep_dir: Path, title_suffix: str = "") -> tuple[list[dict], int]:
    """The table of a Hydra multirun from its job folders' status.json: (rows, how many did not complete)."""
    rows = sweep_rows(sweep_dir)
    return rows, (summarise(rows, sweep_dir, f"multirun {sweep_dir}{title_suffix}") if rows else 0)
