"""A run folder that failed before doing any work leaves nothing behind: Hydra creates it (holding only Hydra's own
files) before the task starts; a user error removes it again."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from promptemb.common.errors import UserError

#: What Hydra itself writes into a run folder before the task starts.
HYDRA_OWN_FILES = (".hydra",)


def remove_if_untouched(folder: Path | None) -> bool:
    """Delete a run folder holding nothing but Hydra's own files (.hydra/ and the job log), i.e. a run that failed
    before doing any work, and the folders above it inside the current directory that this leaves empty
    (`logs/evaluate/` of a default path). True when removed."""
    if folder is None or not Path(folder).is_dir():
        return False
    folder = Path(folder)
    if not all(e.name in HYDRA_OWN_FILES or e.suffix == ".log" for e in folder.iterdir()):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    cwd = Path.cwd().resolve()
    parent = folder.resolve().parent
    while parent != cwd and cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
    return True


@contextlib.contextmanager
def nothing_left_on_user_error(run_dir: Path | None) -> Iterator[None]:
    """A user error raised inside removes `run_dir` (the folder Hydra made for this single run; None: none) if
    nothing but Hydra's files are in it."""
    try:
        yield
    except UserError:
        remove_if_untouched(run_dir)
        raise
