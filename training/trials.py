"""One training run as a trial: its outcome recorded in its run folder, failures contained inside sweeps.

A single run that fails exits non-zero with one line (and a run that failed before doing any work leaves no folder
behind). Inside a sweep (`train.py -m ...` or an Optuna search) a failed trial is recorded as failed with its
one-line reason in `status.json` and the sweep goes on; at the end one table lists every trial with its status and
objective (`summary.md` / `summary.json` in the sweep folder), and the process exits non-zero if any trial failed.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from promptemb.common.errors import PreemptedError, UserError
from promptemb.common.io import atomic_write_json, atomic_write_text
from promptemb.common.overrides import parse_overrides
from promptemb.common.run_folder import remove_if_untouched
from promptemb.research.seed_report import seed_report as write_seed_report
from promptemb.research.seed_report import summary_line
from promptemb.training.run_dirs import in_multirun, is_global_rank_zero

log = logging.getLogger(__name__)
STATUS_FILE = "status.json"
COMPLETED, FAILED, PREEMPTED = "completed", "failed", "preempted"


@dataclass
class TrialOutcome:
    status: str
    objective: float | None = None
    reason: str | None = None
    overrides: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)


def task_overrides() -> list[str]:
    """The command-line overrides of the running Hydra job ([] outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def hydra_job_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None


def run_trial(cfg: DictConfig, train_fn: Callable[[DictConfig], float | None], in_sweep: bool,
              overrides: list[str] | None = None, params: dict | None = None) -> TrialOutcome:
    """Run `train_fn(cfg)` (returning the objective) and record the outcome in the run folder. Outside a sweep an
    error propagates (after the record is written, or the untouched folder removed); inside one it is logged as one
    line and returned as a failed outcome."""
    run_dir = Path(cfg.output_dir)
    if not is_global_rank_zero():  # one record per run, in rank 0's folder, written by rank 0
        objective = train_fn(cfg)
        return TrialOutcome(COMPLETED, objective=objective)
    outcome = TrialOutcome(COMPLETED, overrides=list(overrides if overrides is not None else task_overrides()),
                           params=dict(params or {}))
    try:
        objective = train_fn(cfg)
        outcome.objective = objective if objective is None or math.isfinite(objective) else None
    except Exception as err:
        outcome.status = PREEMPTED if isinstance(err, PreemptedError) else FAILED
        outcome.reason = str(err).splitlines()[0] if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        if not in_sweep and isinstance(err, UserError) and (not run_dir.exists() or remove_if_untouched(run_dir)):
            raise  # failed before any work (the checks may have removed the folder already): nothing is left behind
        record(outcome, run_dir)
        if not in_sweep:
            raise
        log.error("trial failed: %s", outcome.reason)
        return outcome
    record(outcome, run_dir)
    return outcome


def record(outcome: TrialOutcome, run_dir: Path) -> None:
    """status.json in the run folder (and in Hydra's job folder, where a sweep's summary looks for it)."""
    folders = {Path(run_dir)}
    if in_multirun() and (job_dir := hydra_job_dir()) is not None:
        folders.add(job_dir)
    for folder in folders:
        atomic_write_json(folder / STATUS_FILE, {**asdict(outcome), "run_dir": str(run_dir)})


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
        rows = []
        for job_dir in sorted((d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit()),
                              key=lambda d: int(d.name)):
            status = job_dir / STATUS_FILE
            row = {"status": FAILED, "reason": "no status.json: the trial was killed", "objective": None}
            if status.is_file():
                row = json.loads(status.read_text(encoding="utf-8"))
            rows.append({"trial": int(job_dir.name), **row})
        if rows:
            failed = summarise(rows, sweep_dir, f"multirun {sweep_dir}")
            if swept_keys(list(config.hydra.overrides.task)) == ["seed"]:
                seed_report(rows, sweep_dir)
            exit_if_failed(failed, len(rows), sweep_dir)


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys a multirun sweeps over (`seed=0,1,2` -> ["seed"])."""
    try:
        return sorted(o.get_key_element().lstrip("+~") for o in parse_overrides(overrides) if o.is_sweep_override())
    except Exception:  # a syntax error: Hydra has reported it already
        return []


def seed_report(rows: list[dict], sweep_dir: Path) -> None:
    """A sweep over `seed` alone: mean ± std of every score over its completed trials, in the sweep folder (a
    failed seed is left out and the report says how many seeds it has)."""
    runs = [row["run_dir"] for row in rows if row["status"] == COMPLETED and row.get("run_dir")]
    if not runs:
        return
    try:
        report, written = write_seed_report(runs, sweep_dir)
    except UserError as err:
        log.error("no seed report: %s", str(err).splitlines()[0])
        return
    print(f"seed report: {summary_line(report)}\nwrote {', '.join(map(str, written))}", flush=True)
