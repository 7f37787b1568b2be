"""One run per folder: a live run holds its folder's lock, and a folder that holds a run is entered only to resume it.

Two runs writing one folder interleave `metrics.csv` and checkpoints, and a fresh run in a finished run's folder
replaces its curve and metrics while its best checkpoint stays behind. So:

* a live run holds an exclusive `flock` on `RUN/.run.lock` (the file names its pid and host, for the message); the
  kernel releases it when the process ends, however it ends, so a lock file left by a dead process is stale and is
  taken over — there is nothing to clean by hand. The file is removed when the run ends;
* a second run on a folder whose lock is held is refused, resume included;
* a fresh run into a folder that already holds a run (checkpoints, metrics, a status) is refused: resuming it
  (`ckpt_path=` one of its checkpoints) is the way back in, or `overwrite=true` replaces it explicitly.

Only the first process of a job takes the lock: the other ranks of a DDP run are started by it, into its folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from promptemb.common.errors import ConfigError

LOCK_FILE = ".run.lock"
#: What a run writes into its folder (besides Hydra's `.hydra/` and log): any of them means the folder holds a run.
RUN_RECORDS = ("checkpoints", "csv", "status.json", "curve.json", "results.json")
#: Environment variables launchers set on processes other than a job's first one.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")


def first_process_of_job() -> bool:
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def lock_holder(folder: Path) -> str | None:
    """'pid N on HOST' of the live run holding `folder`'s lock, or None (no lock file, or a stale one)."""
    path = Path(folder) / LOCK_FILE
    try:
        handle = path.open("r")
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
        return str(json.loads((Path(folder) / "status.json").read_text(encoding="utf-8"))["status"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unfinished"


def resumes_into(folder: Path, checkpoint: Path | None) -> bool:
    """The checkpoint is one of the folder's own (`FOLDER/checkpoints/*.ckpt`)."""
    return checkpoint is not None and Path(checkpoint).resolve().parent == (Path(folder) / "checkpoints").resolve()


def check_run_folder(folder: str | Path, checkpoint: Path | None, overwrite: bool) -> None:
    """Refuse (one line, before anything is written) a run into a folder another live run holds, or a fresh run into
    a folder that holds a run."""
    folder = Path(folder)
    holder = lock_holder(folder)
    if holder:
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
    """`overwrite=true`: remove the previous run's records (this run's Hydra files, log and lock stay)."""
    for name in (*RUN_RECORDS, "wandb"):
        path = Path(folder) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


@contextlib.contextmanager
def run_folder_lock(folder: str | Path) -> Iterator[None]:
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
