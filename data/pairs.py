"""(anchor, positive) pairs to mine hard negatives for, read from a local file, in file order, repeats kept:

* `sick`: SICK's tab-separated files, the (sentence_A, sentence_B) rows labelled ENTAILMENT;
* `nli_csv`: SimCSE's NLI CSV (`sent0,sent1[,hard_neg]`): (sent0, sent1), an existing hard_neg ignored;
* `pairs_tsv`: one `anchor<TAB>positive` per line, no header.

`file_sentences` gives every sentence a file holds (any SICK label, a CSV's every column), for a candidate corpus.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Literal

from promptemb.common.errors import DataError
from promptemb.data.readers import read_utf8_text

PairFormat = Literal["sick", "nli_csv", "pairs_tsv"]
PAIR_FORMATS = ("sick", "nli_csv", "pairs_tsv")
SICK_HEADER = ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]


def _sick_rows(path: Path) -> list[tuple[str, str, str]]:
    with io.StringIO(read_utf8_text(path), newline=None) as handle:
        header = handle.readline().rstrip("\n").split("\t")
        if header[:5] != SICK_HEADER:
            raise DataError(f"{path}:1: not a SICK file (header {header[:5]}); pass --format nli_csv or pairs_tsv")
        rows = []
        for lineno, line in enumerate(handle, start=2):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 5:
                raise DataError(f"{path}:{lineno}: expected at least 5 tab-separated fields, found {len(fields)}")
            rows.append((fields[1].strip(), fields[2].strip(), fields[4].strip()))
    return rows


def _csv_rows(path: Path) -> list[list[str]]:
    with io.StringIO(read_utf8_text(path), newline="") as handle:
        reader = csv.DictReader(handle)
        if not {"sent0", "sent1"} <= set(reader.fieldnames or ()):
            raise DataError(f"{path}: expected a header with columns sent0,sent1 (found "
                            f"{','.join(reader.fieldnames or []) or 'no header'})")
        columns = [c for c in ("sent0", "sent1", "hard_neg") if c in reader.fieldnames]
        return [[(row[c] or "").strip() for c in columns] for row in reader]


def _tsv_rows(path: Path) -> list[list[str]]:
    rows = []
    for lineno, line in enumerate(io.StringIO(read_utf8_text(path), newline=None), start=1):
        if not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 2:
            raise DataError(f"{path}:{lineno}: expected anchor<TAB>positive, found {len(fields)} field(s)")
        rows.append([field.strip() for field in fields])
    return rows


def read_pairs(path: Path, format: PairFormat) -> list[tuple[str, str]]:
    """The (anchor, positive) pairs of `path` (see the module docstring); an empty sentence or no pair at all is a
    DataError naming the file."""
    if not Path(path).is_file():
        raise DataError(f"pair file {path} does not exist")
    if format == "sick":
        pairs = [(a, b) for a, b, label in _sick_rows(path) if label == "ENTAILMENT"]
    elif format == "nli_csv":
        pairs = [(row[0], row[1]) for row in _csv_rows(path)]
    elif format == "pairs_tsv":
        pairs = [(row[0], row[1]) for row in _tsv_rows(path)]
    else:
        raise DataError(f"unknown pair format {format!r}; valid: {', '.join(PAIR_FORMATS)}")
    if any(not anchor or not positive for anchor, positive in pairs):
        raise DataError(f"{path}: a pair with an empty sentence")
    if not pairs:
        raise DataError(f"{path}: no (anchor, positive) pair in it" + (" (no ENTAILMENT row)" if format == "sick"
                                                                      else ""))
    return pairs


def file_sentences(path: Path, format: PairFormat) -> list[str]:
    """Every non-empty sentence of the file, in order (repeats kept)."""
    if format == "sick":
        rows = [(a, b) for a, b, _ in _sick_rows(path)]
    else:
        rows = _csv_rows(path) if format == "nli_csv" else _tsv_rows(path)
    return [sentence for row in rows for sentence in row if sentence]
