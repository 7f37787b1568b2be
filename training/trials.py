"""One training run as a trial: its outcome recorded in its run folder, failures contained inside sweeps.

A single run that fails exits non-zero with one line. Its folder follows one policy, whatever the failure (bad data
found at setup, out of memory, a diverged loss, Ctrl-C): a folder holding a checkpoint is kept and marked
(`status.json`: failed / preempted / interrupted, with the one-line reason) so it can be resumed or inspected; a folder
without one holds nothing of value and is removed, with the empty folders above it. A refusal before the run takes
its folder (a resume that does not match its checkpoint, a folder held by another run) leaves the folder exactly as
it was. Inside a sweep (`train.py -m ...` or an Optuna search) a failed trial keeps its folder with its
`status.json`, the sweep's record of it, and the sweep goes on; at the end one table lists every trial with its
status and objective (`summary.md` / `summary.json` in the sweep folder), and the process exits non-zero if any
trial failed. Ctrl-C stops the sweep: the interrupted trial is recorded as such and the table is written for the
trials so far.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from promptemb.common.errors import PreemptedError, UserError
from promptemb.common.io import atomic_write_json, atomic_write_text
from promptemb.common.overrides import parse_overrides
from promptemb.common.run_context import FROM_PYTHON, RunContext
from promptemb.common.run_folder import HYDRA_OWN_FILES, remove_if_untouched
from promptemb.research.seed_report import seed_report as write_seed_report
from promptemb.research.seed_report import summary_line
from promptemb.training.run_dirs import is_global_rank_zero, resume_hint
from promptemb.training.run_lock import LOCK_FILE, RUN_RECORDS, first_process_of_job

log = logging.getLogger(__name__)
STATUS_FILE = "status.json"
COMPLETED, FAILED, PREEMPTED, INTERRUPTED = "completed", "failed", "preempted", "interrupted"


class RunInterruptedError(UserError):
    """Ctrl-C (SIGINT): the run stopped where it was; the message says how to resume from its last checkpoint."""

    exit_code = 130  # 128 + SIGINT, what shells report for an interrupted command


@contextlib.contextmanager
def before_the_run() -> Iterator[None]:
    """A user error (or Ctrl-C) raised inside comes before the run takes its folder: `trial` then leaves the
    folder exactly as it found it (no status.json, nothing removed that was there before)."""
    try:
        yield
    except (UserError, KeyboardInterrupt) as err:
        err.before_the_run = True
        raise


def raised_before_the_run(err: BaseException) -> bool:
    return bool(getattr(err, "before_the_run", False))


def has_checkpoint(run_dir: Path) -> bool:
    return any((Path(run_dir) / "checkpoints").glob("*.ckpt"))


#: What a run writes into its folder: a failed run without a checkpoint removes these and, if nothing else is left,
#: the folder (a user's own files in an output_dir they pointed at are never removed).
RUN_WRITES = (*HYDRA_OWN_FILES, *RUN_RECORDS, LOCK_FILE, "wandb", "curve.png", "results.md", "results.png")


def remove_failed_run(run_dir: Path) -> None:
    """The failed-run policy for a folder without a checkpoint: nothing of value, nothing left behind."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    for entry in run_dir.iterdir():
        if entry.name in RUN_WRITES or entry.suffix == ".log" or entry.name.startswith("results_"):  # _<family>.png
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    remove_if_untouched(run_dir)  # now empty unless the user keeps files of their own there


@dataclass
class TrialOutcome:
    status: str
    objective: float | None = None
    reason: str | None = None
    overrides: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)


@contextlib.contextmanager
def trial(run_dir: str | Path, context: RunContext = FROM_PYTHON, params: dict | None = None
          ) -> Iterator[TrialOutcome]:
    """Around one run in `run_dir` started as `context` says (one of a sweep: `context.in_sweep`): yields its
    `TrialOutcome`, in which the block puts the objective; records the outcome in the run folder following the
    failed-run policy above. Outside a sweep an error propagates; inside one it is logged as one line and the block
    ends with a failed outcome, except Ctrl-C, which records the trial and stops the sweep (`RunInterruptedError`)."""
    run_dir = Path(run_dir)
    if not is_global_rank_zero():  # one record per run, in rank 0's folder, written by rank 0
        yield TrialOutcome(COMPLETED)
        return
    outcome = TrialOutcome(COMPLETED, overrides=list(context.overrides), params=dict(params or {}))
    try:
        yield outcome
        objective = outcome.objective
        outcome.objective = objective if objective is None or math.isfinite(objective) else None
    except (Exception, KeyboardInterrupt) as caught:
        # Ctrl-C outside Lightning's fit loop (which train() turns into RunInterruptedError itself)
        err = RunInterruptedError(f"interrupted (Ctrl-C); {resume_hint(run_dir, context)}") if isinstance(
            caught, KeyboardInterrupt) else caught
        outcome.objective = None
        outcome.status = (PREEMPTED if isinstance(err, PreemptedError) else
                          INTERRUPTED if isinstance(err, RunInterruptedError) else FAILED)
        outcome.reason = str(err).splitlines()[0] if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        before = raised_before_the_run(caught)
        if before and not context.in_sweep:
            remove_if_untouched(run_dir)  # only a folder this run's Hydra just created, holding nothing else
        elif before:
            record(outcome, run_dir, context, run_folder=False)
        elif not context.in_sweep and not has_checkpoint(run_dir):
            if first_process_of_job():  # the other ranks of a DDP job share the folder: one process removes it
                remove_failed_run(run_dir)
        else:
            record(outcome, run_dir, context)
        if isinstance(err, RunInterruptedError) and context.multirun:
            summarise_sweep(context.sweep_dir, title_suffix=" (interrupted)")
        if context.in_sweep and not isinstance(err, RunInterruptedError):
            log.error("trial failed: %s", outcome.reason)
            return  # the sweep goes on
        if err is caught:
            raise
        raise err from None
    record(outcome, run_dir, context)


def run_trial(settings, train_fn: Callable, in_sweep: bool = False, overrides: list[str] | None = None,
              params: dict | None = None) -> TrialOutcome:
    """`train_fn(settings)` (returning the objective) as a trial in `settings.output_dir`."""
    context = RunContext(overrides=tuple(overrides or ()), trial=0 if in_sweep else None)
    with trial(settings.output_dir, context, params) as outcome:
        outcome.objective = train_fn(settings)
    return outcome


def record(outcome: TrialOutcome, run_dir: Path, context: RunContext, run_folder: bool = True) -> None:
    """status.json in the run folder (unless `run_folder` is false: a refused run leaves it untouched) and in
    Hydra's job folder, where a sweep's summary looks for it."""
    folders = {Path(run_dir)} if run_folder else set()
    if context.multirun and context.job_dir is not None:
        folders.add(context.job_dir)
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
        rows, failed = summarise_sweep(sweep_dir)
        if rows:
            if swept_keys(list(config.hydra.overrides.task)) == ["seed"]:
                seed_report(rows, sweep_dir)
            exit_if_failed(failed, len(rows), sweep_dir)


def summarise_sweep(sweep_dir: Path, title_suffix: str = "") -> tuple[list[dict], int]:
    """The table of a Hydra multirun from its job folders' status.json: (rows, how many did not complete)."""
    rows = []
    for job_dir in sorted((d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit()),
                          key=lambda d: int(d.name)):
        status = job_dir / STATUS_FILE
        row = {"status": FAILED, "reason": "no status.json: the trial was killed", "objective": None}
        if status.is_file():
            row = json.loads(status.read_text(encoding="utf-8"))
        rows.append({"trial": int(job_dir.name), **row})
    return rows, (summarise(rows, sweep_dir, f"multirun {sweep_dir}{title_suffix}") if rows else 0)


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
