"""A run folder that failed before doing any work leaves nothing behind: Hydra creates it (holding only Hydra's own
files) before the task starts; a user error removes it again. Also: checking, before Hydra runs, that the folder can
be created at all."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from promptemb.common.errors import UserError
from promptemb.common.validation import check_writable_dir
from promptemb.configs import CONFIG_DIR


def check_run_dir_before_hydra(config_name: str, argv: list[str]) -> None:
    """Hydra creates the run folder (`hydra.run.dir`, which is `output_dir`) before the task starts, and fails with
    a traceback when it cannot: check that it can, first, with one line. Flags (-m, --cfg, ...) are left to Hydra."""
    if any(arg.startswith("-") for arg in argv):
        return
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            run_dir = compose(config_name, overrides=argv, return_hydra_config=True).hydra.run.dir
    except Exception:  # overrides that do not compose: Hydra reports them
        return
    check_writable_dir("output_dir", run_dir)


#: What Hydra itself writes into a run folder before the task starts.
HYDRA_OWN_FILES = (".hydra",)


def hydra_run_dir() -> Path | None:
    """The folder Hydra created for this single run (None outside Hydra and in multirun: a failed trial's folder
    keeps its reason there)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    config = HydraConfig.get()
    if config.mode != RunMode.RUN:
        return None
    return Path(config.runtime.output_dir)


def remove_if_untouched(folder: Path) -> bool:
    """Delete a run folder holding nothing but Hydra's own files (.hydra/ and the job log), i.e. a run that failed
    before doing any work, and the folders above it inside the current directory that this leaves empty
    (`logs/evaluate/` of a default path). True when removed."""
    folder = Path(folder)
    if not folder.is_dir() or not all(e.name in HYDRA_OWN_FILES or e.suffix == ".log" for e in folder.iterdir()):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    cwd = Path.cwd().resolve()
    parent = folder.resolve().parent
    while parent != cwd and cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
    return True


def discard_hydra_run_dir() -> None:
    """`remove_if_untouched` for this single run's Hydra folder."""
    run_dir = hydra_run_dir()
    if run_dir is not None:
        remove_if_untouched(run_dir)


@contextlib.contextmanager
def nothing_left_on_user_error() -> Iterator[None]:
    """A user error raised inside removes the Hydra folder of the run if nothing but Hydra's files are in it."""
    try:
        yield
    except UserError:
        discard_hydra_run_dir()
        raise
