"""A mined triplet file and its provenance: `FILE.csv` in SimCSE's NLI format (`sent0,sent1,hard_neg`, what the
supervised datamodule reads with `format: nli_csv`) and `FILE.csv.json` beside it, recording what made it (the
encoder and its weights, the pooler and input form, the mining settings, the source pairs' and corpus files'
sha256) and the sha256 of the CSV itself. Whoever reads the CSV (`mined_provenance`) checks that sha256 first: a
file edited, truncated or swapped after mining is refused in one line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from promptemb.common.errors import DataError
from promptemb.common.io import atomic_write_json, atomic_write_text
from promptemb.data.checksums import sha256_file

KIND = "promptemb.mined_triplets"
FORMAT_VERSION = 1
COLUMNS = ("sent0", "sent1", "hard_neg")
#: what a mined file's provenance keeps in a run's lineage and an export's record (no timestamp: the same file
#: mined twice is the same training data)
SUMMARY_KEYS = ("encoder", "settings", "source", "corpus", "held_out_tasks", "output")


def provenance_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".json")


def triplets_csv(triplets: list[tuple[str, str, str]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(triplets)
    return buffer.getvalue()


def write_mined_file(path: Path, triplets: list[tuple[str, str, str]], record: dict) -> tuple[Path, Path]:
    """The CSV, then its provenance (with the CSV's sha256 and row count), each written atomically."""
    path = Path(path)
    atomic_write_text(path, triplets_csv(triplets))
    record = {"kind": KIND, "format_version": FORMAT_VERSION, **record,
              "output": {"file": path.name, "format": "nli_csv", "columns": list(COLUMNS), "rows": len(triplets),
                         "sha256": sha256_file(path, cached=False)}}
    return path, atomic_write_json(provenance_path(path), record)


def mined_provenance(path: Path) -> dict | None:
    """The provenance of a mined triplet file, checked against the file (sha256); None when `path` has no such
    record beside it (a triplet file from elsewhere, e.g. SimCSE's NLI CSV)."""
    beside = provenance_path(path)
    if not beside.is_file():
        return None
    try:
        record = json.loads(beside.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{beside} is not valid JSON ({err}); re-mine {Path(path).name} or remove the record") from None
    if not isinstance(record, dict) or record.get("kind") != KIND:
        return None  # some other file's JSON that happens to share the name
    recorded = (record.get("output") or {}).get("sha256")
    if not isinstance(recorded, str) or record.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{beside}: a mined-file record without the file's sha256 (format_version "
                        f"{record.get('format_version')!r}); re-mine {Path(path).name}")
    actual = sha256_file(Path(path))
    if actual != recorded:
        raise DataError(f"{path} is not the file that was mined (sha256 {actual[:12]}..., its provenance {beside.name} "
                        f"records {recorded[:12]}...): it was edited or replaced after mining; mine it again, or "
                        "remove the provenance file to train on it as a plain NLI CSV")
    return record


def mined_summary(record: dict | None) -> dict | None:
    """What a run and an export keep of a mined file's provenance."""
    if record is None:
        return None
    return {key: record.get(key) for key in SUMMARY_KEYS}
