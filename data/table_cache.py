"""A verified cache of Arrow tables on disk (`datasets`, memory-mapped), shared by the training corpora
(`corpus_tables.py`) and their pre-tokenized ids (`pretokenized.py`).

A table is built once into a staging folder beside its final place, recorded and renamed into place, so
concurrent ranks or runs never see half a cache; a concurrent builder that renamed first wins. The record
(`key.json`, written last: a folder without it is no cache) holds the key the cache was built for, its row count
and the size and sha256 of each of its files. Every open checks the sizes, the hashes of each file's first and
last MiB and the row count, and the full hashes when the cache is small enough to hash in well under a second, when
it was just built, or on request (`verify=True`); a damaged cache (truncated, overwritten, zeroed blocks) is moved
aside and rebuilt with a one-line warning, never read. The table is the folder's `.arrow` files in name order, each
opened memory-mapped (`datasets.Dataset.from_file`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from promptemb.data.checksums import sha256_file

log = logging.getLogger(__name__)
#: Caches up to this size are hashed in full on every open (about 0.3 s); larger ones when built or on request.
FULL_CHECK_BYTES = 256 << 20
#: Of a larger cache, every open hashes this much of each file's start and end (the Arrow schema and the first and
#: last record batches: a file overwritten or replaced is caught without reading it all).
EDGE_BYTES = 1 << 20
RECORD_FILE = "key.json"


def cache_name(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def cached_table(folder: Path, key: dict, write: Callable[[Path], dict], verify: bool = False,
                 label: str = "cache"):
    """(table, record) of the cache at `folder` built for `key`: opened when it checks out, else built by
    `write(staging)`, which writes the table's `.arrow` files into the staging folder and returns what else the
    record keeps (counts, say). An error in `write` leaves nothing behind. `verify`: hash the cache's files in full
    whatever their size. `label` names the cache in the damage warning."""
    if (folder / RECORD_FILE).is_file():
        table, record, problem = open_checked(folder, key, full=verify)
        if table is not None:
            return table, record
        log.warning("%s %s is damaged (%s); rebuilding it", label, folder, problem)
        move_aside(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    build(folder, key, write)
    table, record, problem = open_checked(folder, key, full=True)
    if table is None:  # what was just written (by us or a concurrent builder) does not read back: the disk is at fault
        raise OSError(f"the {label} {folder} just written does not read back ({problem}); check the disk holding "
                      f"{folder.parent}")
    return table, record


def build(final: Path, key: dict, write: Callable[[Path], dict]) -> None:
    """Write into a staging folder beside `final`, record rows and file hashes, rename it to `final`. A concurrent
    builder that renamed first wins; ours is discarded."""
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".staging", dir=final.parent))
    try:
        extra = write(staging)
        files = {path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path, cached=False),
                             "edges_sha256": edges_sha256(path)}
                 for path in sorted(staging.iterdir()) if path.is_file()}
        record = {**extra, **key, "rows": len(load_table(staging, files)), "files": files}
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))
        os.rename(staging, final)
    except OSError:
        if not (final / RECORD_FILE).is_file():  # not a concurrent build that finished first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_table(folder: Path, files: dict):
    """The table of a cache folder: its `.arrow` files in name order, memory-mapped."""
    import datasets

    tables = [datasets.Dataset.from_file(str(folder / name)) for name in sorted(files) if name.endswith(".arrow")]
    if not tables:
        raise ValueError("no .arrow file")
    return tables[0] if len(tables) == 1 else datasets.concatenate_datasets(tables)


def edges_sha256(path: Path) -> str:
    """sha256 of the first and last `EDGE_BYTES` of a file (all of it when smaller)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(EDGE_BYTES))
        size = path.stat().st_size
        if size > 2 * EDGE_BYTES:
            handle.seek(size - EDGE_BYTES)
            digest.update(handle.read(EDGE_BYTES))
        elif size > EDGE_BYTES:
            digest.update(handle.read())
    return digest.hexdigest()


def check_files(folder: Path, key: dict, full: bool) -> tuple[dict | None, str | None]:
    """(the cache's record, None) when its files are as recorded, else (None, what is wrong). Sizes and the hashes of
    each file's start and end always; the full sha256 when `full` or when the files are small enough to hash
    quickly."""
    try:
        record = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None, f"{RECORD_FILE} is unreadable"
    if not isinstance(record, dict) or {k: record.get(k) for k in key} != key or not isinstance(
            record.get("files"), dict) or not isinstance(record.get("rows"), int):
        return None, f"{RECORD_FILE} does not describe this table"
    try:
        return check_recorded_files(folder, record, full)
    except OSError as err:  # a file vanished mid-check: another process moved the damaged cache aside meanwhile
        return None, f"its files changed while being checked ({err.strerror or err})"


def check_recorded_files(folder: Path, record: dict, full: bool) -> tuple[dict | None, str | None]:
    files = record["files"]
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            return None, f"{name} is missing"
        if path.stat().st_size != expected.get("bytes"):
            return None, f"{name} has {path.stat().st_size} bytes, not the {expected.get('bytes')} written"
        if edges_sha256(path) != expected.get("edges_sha256"):
            return None, f"{name} does not match the sha256 of its start and end recorded when it was written"
    if full or sum(entry.get("bytes", 0) for entry in files.values()) <= FULL_CHECK_BYTES:
        for name, expected in files.items():
            if sha256_file(folder / name, cached=False) != expected.get("sha256"):
                return None, f"{name} does not match the sha256 recorded when it was written"
    return record, None


def open_checked(folder: Path, key: dict, full: bool):
    """(the table, its record, None) when the cache at `folder` checks out (files, then rows as loaded), else
    (None, None, why)."""
    record, problem = check_files(folder, key, full)
    if record is None:
        return None, None, problem
    try:
        table = load_table(folder, record["files"])
    except Exception as err:  # pyarrow and datasets raise many kinds for a damaged table
        return None, None, f"it does not load ({type(err).__name__})"
    if len(table) != record["rows"]:
        return None, None, f"{len(table)} rows, not the {record['rows']} written"
    return table, record, None


def move_aside(folder: Path) -> None:
    """Rename a damaged cache out of the way (then delete it), so that a rebuild can take its name. A concurrent
    process may have moved it already, or replaced it with a good one meanwhile: only the folder found damaged, by
    inode, is moved."""
    try:
        inode = folder.stat().st_ino
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".damaged", dir=folder.parent))
    except OSError:
        return
    try:
        if folder.stat().st_ino == inode:
            os.replace(folder, aside / folder.name)
    except OSError:  # moved or replaced by a concurrent process: nothing of ours to move
        pass
    shutil.rmtree(aside, ignore_errors=True)
