"""Atomic writes: readers never see a half-written result file."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """Read without changing it where Linux allows (os.umask would briefly set it process-wide, under the feet of
    other threads such as W&B's writers)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


def umask_mode(directory: bool = False) -> int:
    """The mode a plain open()/mkdir() would give under the current umask (mkstemp/mkdtemp give owner-only)."""
    return (0o777 if directory else 0o666) & ~current_umask()


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make a rename inside `directory` durable (a no-op where directories cannot be opened, as on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_path)` on a temporary file next to `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        tmp.chmod(umask_mode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def finite_or_null(obj: Any) -> Any:
    """`obj` with every NaN/inf float (numpy and 0-d torch scalars included) replaced by None, so it serialises as
    strict JSON."""
    if isinstance(obj, dict):
        return {key: finite_or_null(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(value) for value in obj]
    if getattr(obj, "ndim", None) == 0 and hasattr(obj, "item"):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Strict JSON (RFC 8259: no NaN/Infinity tokens; non-finite numbers are written as null)."""
    text = json.dumps(finite_or_null(obj), indent=2, sort_keys=False, allow_nan=False)
    return atomic_write_text(path, text + "\n")
