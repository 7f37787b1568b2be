"""`RunContext`: how this run was started. The command lines read it from Hydra once
(`common.hydra_bridge.running_context`) and pass it down with the settings; a call from Python gets the default."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from promptemb.common.validation import Settings


@dataclass(frozen=True)
class RunContext:
    overrides: tuple[str, ...] = ()  # this job's command-line overrides (a sweep job's or a trial's own values)
    run_dir: Path | None = None  # the folder Hydra made for a single run (`output_dir`: .hydra/ and the log)
    multirun: bool = False  # a job of `-m`
    job_dir: Path | None = None  # that job's folder, and its sweep's
    sweep_dir: Path | None = None
    trial: int | None = None  # the number of an Optuna trial (its config composed in process)
    composition_only: bool = False  # a check of a command line from Python: no machine or file system checks

    @property
    def in_sweep(self) -> bool:
        """One of several runs: a failed one is recorded and the sweep goes on."""
        return self.multirun or self.trial is not None

    def for_trial(self, number: int, overrides: list[str]) -> RunContext:
        return replace(self, trial=number, overrides=tuple(overrides))


class RunPaths(Settings):
    """The `paths` group (configs/paths/): runs are written under `<log_dir>/<task_name>/`."""
    described_as: ClassVar[str] = "the paths group"

    log_dir: str


#: A run started from Python (tests, notebooks): no command line, no Hydra folder, no sweep.
FROM_PYTHON = RunContext()
