"""A training run's folder, from where it is to what is left of it: one lifecycle, one policy.

* **Where** (`run_dir`, the `promptemb.run_dir` resolver behind train.py's `output_dir`): a new timestamped folder
  `<log_dir>/<task_name>/runs/<stamp>` (microseconds: no two runs share one), a sweep's numbered job folder, the
  resumed checkpoint's own run folder (`ckpt_path=PATH`, or `last` / `resume=true`: the newest `last.ckpt` of the
  task, or of `output_dir=` when it is given), rank 0's folder in the DDP ranks it starts.
* **Taken** (`take`, before Hydra's job writes anything into it): a resume's checkpoint is read (its header only),
  must hold the optimizer state and the lineage of these settings (training/lineage.py); a folder held by a live run
  is refused, and so is a fresh run into a folder that holds a run (resume it, or `overwrite=true`). Then the folder's
  lock (`flock` on `.run.lock`, released by the kernel however the process ends: a stale lock is taken over), the
  loggers (W&B credentials and the resumed run id) and `overwrite`'s clearing. Any refusal leaves the folder exactly as
  it was. Only the first process of a job takes it: the other DDP ranks run in the folder it holds.
* **Left** (`outcome`, around the run): the outcome is recorded (`status.json`: completed, failed, preempted,
  interrupted, with the one-line reason). The one policy for a failed run: a folder holding a checkpoint is kept (to
  resume or inspect), a folder without one holds nothing of value and what the run wrote is removed (the folder too,
  unless the user keeps files of their own there). Inside a sweep a failed trial keeps its folder and record, and the
  sweep goes on; Ctrl-C stops the sweep. A stopped run's one line gives the exact command that resumes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import shlex
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from promptemb.common.errors import ConfigError, PreemptedError, UserError
from promptemb.common.hydra_bridge import register_resolver, running_context
from promptemb.common.io import atomic_write_json
from promptemb.common.run_context import FROM_PYTHON, RunContext
from promptemb.common.run_folder import HYDRA_OWN_FILES, remove_if_untouched
from promptemb.training.trials import COMPLETED, FAILED, INTERRUPTED, PREEMPTED, STATUS_FILE, summarise_sweep

log = logging.getLogger(__name__)

LAST = "last"
LOCK_FILE = ".run.lock"
#: What a run writes into its folder (besides Hydra's `.hydra/` and log): any of them means the folder holds a run.
RUN_RECORDS = ("checkpoints", "csv", STATUS_FILE, "curve.json", "results.json")
#: What a failed run without a checkpoint removes (a user's own files in an output_dir they pointed at stay).
RUN_WRITES = (*HYDRA_OWN_FILES, *RUN_RECORDS, LOCK_FILE, "wandb", "curve.png", "results.md", "results.png")
#: Environment variables launchers set on processes other than a job's first one.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
#: Set by a training run for the DDP ranks Lightning starts as new processes: they compose the same config, and must
#: write into the run folder of rank 0, not resolve a timestamped folder of their own.
RANK_ZERO_RUN_DIR = "PROMPTEMB_RANK_ZERO_RUN_DIR"


class RunInterruptedError(UserError):
    """Ctrl-C (SIGINT): the run stopped where it was; the message says how to resume from its last checkpoint."""

    exit_code = 130  # 128 + SIGINT, what shells report for an interrupted command


def first_process_of_job() -> bool:
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def is_global_rank_zero() -> bool:
    """Whether this process keeps the run's records (Lightning's global rank; 0 outside distributed training)."""
    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


# -- where ----------------------------------------------------------------------------------------------------------


def newest_last_checkpoint(task_dir: Path) -> Path | None:
    """The most recently written `checkpoints/last.ckpt` of any run (or trial) of one task."""
    candidates = [*task_dir.glob("runs/*/checkpoints/last.ckpt"), *task_dir.glob("multiruns/*/*/checkpoints/last.ckpt")]
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def resume_checkpoint(ckpt_path: str | None, resume: bool, task_dir: str | Path,
                      run_folder: str | Path | None = None) -> Path | None:
    """The checkpoint a run resumes from: `ckpt_path` as given, or for `last` / `resume=true` the run folder's own
    `checkpoints/last.ckpt` when `output_dir=` names one, else the newest one of the task; None for a fresh run. A
    `last` with nothing to resume is an error, and so is a named run folder without a last.ckpt (never another run's
    checkpoint resumed into it). `run_folder`: the run's own folder, None where it has none yet (the resolver
    computing it) or shares `last` with the task (a sweep's trials)."""
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


def run_dir(ckpt_path: str | None, resume: bool, task_dir: str, stamp: str) -> str:
    """`output_dir`'s default: rank 0's folder in a DDP rank it started, this trial's folder in a sweep, the resumed
    checkpoint's run folder, else a new timestamped folder."""
    if os.environ.get(RANK_ZERO_RUN_DIR):
        return os.environ[RANK_ZERO_RUN_DIR]
    if (job := running_context()).multirun:
        return str(job.job_dir)
    try:
        checkpoint = resume_checkpoint(ckpt_path, bool(resume), task_dir)
    except ConfigError:  # `take` reports it with its one line; the config needs some folder meanwhile
        checkpoint = None
    if checkpoint is not None and checkpoint.parent.name == "checkpoints":
        return str(checkpoint.parent.parent)
    return str(Path(task_dir) / "runs" / stamp)


register_resolver("promptemb.run_dir", run_dir)


def resume_command(output_dir: str | Path, checkpoint: str | Path, overrides: tuple[str, ...]) -> str:
    """The command line that resumes this run from `checkpoint` into its own folder: this process's command with
    the run's `overrides` and `ckpt_path` and `output_dir` set explicitly (a sweep's trial resumes as a single run)."""
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


# -- taken ----------------------------------------------------------------------------------------------------------


def lock_holder(folder: Path) -> str | None:
    """'pid N on HOST' of the live run holding `folder`'s lock, or None (no lock file, or a stale one)."""
    try:
        handle = (Path(folder) / LOCK_FILE).open("r")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return describe_holder(handle.read())
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def describe_holder(text: str) -> str:
    try:
        owner = json.loads(text)
        return f"pid {owner['pid']} on {owner['host']}"
    except (ValueError, KeyError, TypeError):
        return "another process"


def in_use(folder: Path, holder: str) -> ConfigError:
    return ConfigError(f"output_dir {folder} is in use by a live run ({holder}); wait for it to end or stop it, or "
                       "pass another output_dir")


def holds_a_run(folder: Path) -> bool:
    return any((Path(folder) / name).exists() for name in RUN_RECORDS)


def recorded_status(folder: Path) -> str:
    """'completed', 'failed', ... from the folder's status.json; 'unfinished' without one (killed, or running)."""
    try:
        return str(json.loads((Path(folder) / STATUS_FILE).read_text(encoding="utf-8"))["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unfinished"


def resumes_into(folder: Path, checkpoint: Path | None) -> bool:
    """The checkpoint is one of the folder's own (`FOLDER/checkpoints/*.ckpt`)."""
    return checkpoint is not None and Path(checkpoint).resolve().parent == (Path(folder) / "checkpoints").resolve()


def check_run_folder(folder: str | Path, checkpoint: Path | None, overwrite: bool) -> None:
    """Refuse a run into a folder another live run holds, or a fresh run into a folder that holds a run."""
    folder = Path(folder)
    if holder := lock_holder(folder):
        raise in_use(folder, holder)
    if overwrite and resumes_into(folder, checkpoint):  # the checkpoint would be deleted before it is read
        raise ConfigError(f"overwrite=true would delete {checkpoint}, the checkpoint this run resumes from: drop "
                          "overwrite=true to resume the run, or ckpt_path to replace it with a fresh one")
    if not holds_a_run(folder) or resumes_into(folder, checkpoint) or overwrite:
        return
    last = folder / "checkpoints" / "last.ckpt"
    back_in = f"resume it with ckpt_path={last}, " if last.is_file() else ""
    raise ConfigError(f"output_dir {folder} already holds a run ({recorded_status(folder)}); {back_in}pass another "
                      "output_dir, or overwrite=true to replace it")


def clear_run_folder(folder: Path) -> None:
    """`overwrite=true`: remove the previous run's records (this run's lock stays)."""
    for name in (*RUN_RECORDS, "wandb"):
        path = Path(folder) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


@contextlib.contextmanager
def folder_lock(folder: str | Path) -> Iterator[None]:
    """Hold `folder`'s lock while the block runs (ConfigError if a live run holds it); the lock file is removed at
    the end. A no-op in the other processes of a DDP job."""
    if not first_process_of_job():
        yield
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    while True:
        handle = path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = describe_holder(handle.read())
            handle.close()
            raise in_use(folder, holder) from None
        # the previous holder may have removed the file between our open and our lock: lock the file that is there
        try:
            same = os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
        handle.flush()
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):  # the failed-run policy may have removed the folder
            path.unlink()
        handle.close()  # closing releases the lock, after the file is gone


@dataclass
class TakenFolder:
    """A checked run holding its folder: the checkpoint it resumes from, the lineage a resume compared (else computed
    when training starts), the loggers."""

    path: Path
    checkpoint: Path | None
    lineage: dict | None
    loggers: list


@contextlib.contextmanager
def take(settings, context: RunContext = FROM_PYTHON) -> Iterator[TakenFolder]:
    """Every refusal that must come before the run writes anything, then the folder's lock (held until the block
    ends), the loggers and `overwrite`'s clearing; a refusal leaves the folder exactly as it was."""
    from promptemb.data.root import resolve_data_root
    from promptemb.exporting.runner import check_out
    from promptemb.lightning_modules.checkpoint import read_checkpoint
    from promptemb.training.checkpointing import check_resumable
    from promptemb.training.lineage import check_lineage, run_lineage
    from promptemb.training.loggers import build_loggers

    folder = Path(settings.output_dir)
    existed = folder.exists()
    resolve_data_root(settings.data_root)  # evaluation needs it; fail before loading any model
    # the run's own folder: `output_dir=DIR ckpt_path=last` resumes DIR's last.ckpt (a sweep's trials keep resolving
    # `last` to the newest run of the task)
    task_dir = Path(settings.paths.log_dir) / settings.task_name
    checkpoint = resume_checkpoint(settings.ckpt_path, settings.resume, task_dir,
                                   run_folder=None if context.multirun else settings.output_dir)
    resumed = read_checkpoint(checkpoint, argument="ckpt_path") if checkpoint else None  # the header only
    lineage = run_lineage(settings) if checkpoint else None  # a fresh run computes it when training starts
    if checkpoint:
        check_resumable(checkpoint, resumed)
        check_lineage(checkpoint, resumed, lineage)
    if first_process_of_job():  # the other ranks of a DDP job run in the folder their first process holds
        check_run_folder(folder, checkpoint, settings.overwrite)
    if settings.export_dir:
        check_out(Path(settings.export_dir), overwrite=False)  # fail before training, not after
    with folder_lock(folder):  # from here on no other run enters the folder
        try:
            loggers = build_loggers(settings.logger, resumed)  # W&B: credentials, the resumed run id
        except BaseException:
            if not existed:
                remove_if_untouched(folder)
            raise
        if _RECORDING:  # from here on a failure is the run's, recorded by the policy
            _RECORDING[-1].taken = True
        if settings.overwrite and first_process_of_job():
            clear_run_folder(folder)
        if checkpoint:
            log.info("resuming from %s (step %s) into %s", checkpoint, resumed.get("global_step"), folder)
        yield TakenFolder(folder, checkpoint, lineage, loggers)


# -- left -----------------------------------------------------------------------------------------------------------


def has_checkpoint(folder: Path) -> bool:
    return any((Path(folder) / "checkpoints").glob("*.ckpt"))


def remove_failed_run(folder: Path) -> None:
    """The failed-run policy for a folder without a checkpoint: nothing of value, nothing left behind."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name in RUN_WRITES or entry.suffix == ".log" or entry.name.startswith("results_"):  # _<family>.png
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    remove_if_untouched(folder)  # now empty unless the user keeps files of their own there


@dataclass
class Outcome:
    status: str
    objective: float | None = None
    reason: str | None = None
    overrides: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    #: the run took its folder (`take` marks the outcome it runs in); an error before that leaves the folder as it was
    taken: bool = field(default=False, repr=False)


#: the outcomes being recorded in this process, innermost last: `take` marks the innermost as taken
_RECORDING: list[Outcome] = []


def record(outcome: Outcome, folder: Path, context: RunContext) -> None:
    """status.json in the run folder (once the run took it) and in Hydra's job folder, where a sweep's summary looks
    for it."""
    folders = {Path(folder)} if outcome.taken else set()
    if context.multirun and context.job_dir is not None:
        folders.add(context.job_dir)
    fields = {name: value for name, value in asdict(outcome).items() if name != "taken"}
    for target in folders:
        atomic_write_json(target / STATUS_FILE, {**fields, "run_dir": str(folder)})


@contextlib.contextmanager
def outcome(folder: str | Path, context: RunContext = FROM_PYTHON, params: dict | None = None,
            taken: bool = False) -> Iterator[Outcome]:
    """Around one run in `folder`: yields its `Outcome` (the block sets the objective; `take` inside it marks it
    taken, `taken=True`: the folder was taken before) and leaves the folder as the policy above says. Outside a sweep
    an error propagates; inside one it is logged as one line and the block ends with a failed outcome, except Ctrl-C,
    which records the trial and stops the sweep (`RunInterruptedError`)."""
    folder = Path(folder)
    if not is_global_rank_zero():  # one record per run, in rank 0's folder, written by rank 0
        yield Outcome(COMPLETED)
        return
    result = Outcome(COMPLETED, overrides=list(context.overrides), params=dict(params or {}), taken=taken)
    _RECORDING.append(result)
    try:
        yield result
        if result.objective is not None and not math.isfinite(result.objective):
            result.objective = None
    except (Exception, KeyboardInterrupt) as caught:
        # Ctrl-C outside Lightning's fit loop (which `train` turns into RunInterruptedError itself)
        err = RunInterruptedError(f"interrupted (Ctrl-C); {resume_hint(folder, context)}") if isinstance(
            caught, KeyboardInterrupt) else caught
        result.objective = None
        result.status = (PREEMPTED if isinstance(err, PreemptedError) else
                         INTERRUPTED if isinstance(err, RunInterruptedError) else FAILED)
        result.reason = str(err).splitlines()[0] if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        if not result.taken:
            if context.in_sweep:
                record(result, folder, context)  # in the sweep's job folder only
        elif not context.in_sweep and not has_checkpoint(folder):
            if first_process_of_job():  # the other ranks of a DDP job share the folder: one process removes it
                remove_failed_run(folder)
        else:
            record(result, folder, context)
        if isinstance(err, RunInterruptedError) and context.multirun:
            summarise_sweep(context.sweep_dir, title_suffix=" (interrupted)")
        if context.in_sweep and not isinstance(err, RunInterruptedError):
            log.error("trial failed: %s", result.reason)
            return  # the sweep goes on
        if err is caught:
            raise
        raise err from None
    finally:
        _RECORDING.remove(result)
    record(result, folder, context)
