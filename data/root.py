"""Where the SentEval-layout data lives: from config, else the environment; never hard-coded."""

from __future__ import annotations

import os
from pathlib import Path

from promptemb.common.errors import DataError

DATA_ROOT_ENV = "PROMPTEMB_DATA"


def resolve_data_root(configured: str | os.PathLike | None = None) -> Path:
    """Return the data root: `configured` if given, else `$PROMPTEMB_DATA`; it must be an existing directory."""
    value = configured if configured not in (None, "") else os.environ.get(DATA_ROOT_ENV)
    if not value:
        raise DataError(
            f"no data root set: pass data_root=PATH or export {DATA_ROOT_ENV}=PATH "
            "(fetch the data with `python -m promptemb.data.download --dest PATH`)"
        )
    root = Path(value).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data root {root} does not exist: pass data_root=PATH or export {DATA_ROOT_ENV}=PATH "
            "(fetch the data with `python -m promptemb.data.download --dest PATH`)"
        )
    return root
