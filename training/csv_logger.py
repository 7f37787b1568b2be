"""The CSV logger of the `logger=csv` default, made resumable.

Lightning's CSVLogger deletes an existing metrics.csv when it starts, so resuming from a checkpoint (same
output_dir) would lose every metric logged before it. With `resume_step` set, the rows that describe the resumed
checkpoint's history are kept: every row before that step, and the dev evaluation AT that step (it scored the
checkpointed weights and is not repeated). Training rows at or after it are dropped: the resumed run logs them again.
"""

from __future__ import annotations

import csv
from pathlib import Path

from lightning_fabric.loggers.logger import rank_zero_experiment
from pytorch_lightning.loggers import CSVLogger


class ResumableCSVLogger(CSVLogger):
    def __init__(self, *args, resume_step: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None and self.resume_step is not None:
            kept = kept_rows(Path(self.log_dir) / "metrics.csv", self.resume_step)
            writer = super().experiment  # removes the old metrics.csv
            writer.metrics = kept + writer.metrics  # written back, with the new rows, at the next save
            return writer
        return super().experiment


def kept_rows(path: Path, resume_step: int) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as file:
        rows = [{key: value for key, value in row.items() if value != ""} for row in csv.DictReader(file)]

    def keep(row: dict[str, str]) -> bool:
        step = int(float(row.get("step", -1)))
        return step < resume_step or (step == resume_step and any(key.startswith("val/") for key in row))

    return [row for row in rows if keep(row)]
