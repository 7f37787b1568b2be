"""sha256 verification of data files, cached per (path, size, mtime) so a process hashes each file once."""

from __future__ import annotations

import hashlib
from pathlib import Path

from promptemb.common.errors import DataError

_CACHE: dict[tuple[str, int, int], str] = {}


def sha256_file(path: Path, cached: bool = True) -> str:
    """`cached=False`: hash the bytes now (damage that kept size and mtime, such as zeroed blocks, is seen)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE or not cached:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _CACHE[key] = digest.hexdigest()
    return _CACHE[key]


def count_lines(path: Path) -> int:
    """Lines as `wc -l` counts them, plus a last line without a newline."""
    lines, last = 0, b"\n"
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def verify_file(root: Path, relative: str, expected_sha256: str) -> Path:
    """Return `root/relative` after checking it exists and has the expected sha256."""
    path = root / relative
    if not path.is_file():
        raise DataError(
            f"missing data file {path}: check data_root, or fetch the data with "
            f"`python -m promptemb.data.download --dest {root}`"
        )
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise DataError(
            f"checksum mismatch for {path}: expected sha256 {expected_sha256}, got {actual}; "
            "the file is corrupt or a different version: re-download it"
        )
    return path
