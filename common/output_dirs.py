"""Where a script writes: a fresh folder by default, never over earlier (or committed) results."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from promptemb.common.errors import ConfigError


def fresh_output_dir(given: str | Path | None, name: str, overwrite: bool = False, log_dir: str | Path = "logs"
                     ) -> Path:
    """`given`, or `<log_dir>/<name>/<UTC timestamp with microseconds>` when None (a new folder for every run). An
    existing non-empty folder is refused with one line unless `overwrite` (its files of the same names are then
    replaced)."""
    if given is None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d_%H-%M-%S_%f")
        return Path(log_dir) / name / stamp
    path = Path(given)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output folder {path} is a file; name a folder")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ConfigError(f"output folder {path} is not empty; name a new folder, leave the option out for a fresh "
                          f"one under {Path(log_dir) / name}, or pass --overwrite to replace its files")
    return path
