"""Readers for the SentEval file layout, with SentEval's exact conventions.

* Sentences are whitespace-split and re-joined with one space (SentEval stores token lists; SimCSE/PromptBERT
  batchers join them with " ").
* STS12-16: `STS.input.<subset>.txt` holds `sent1<TAB>sent2`, `STS.gs.<subset>.txt` one gold score per line; a blank
  gold line marks an unscored pair, which is dropped.
* STS-B csv: tab-separated, score in column 4, sentences in columns 5 and 6 (extra columns ignored).
* SICK: header line, then `pair_ID<TAB>sentence_A<TAB>sentence_B<TAB>relatedness_score<TAB>...`.

Every malformed line raises `DataError` naming `file:line`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from promptemb.common.errors import DataError


@dataclass
class SentencePairs:
    """Scored sentence pairs; `subsets[i]` names the file pair i came from."""

    sentences1: list[str] = field(default_factory=list)
    sentences2: list[str] = field(default_factory=list)
    gold: list[float] = field(default_factory=list)
    subsets: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.gold)

    def extend(self, other: SentencePairs) -> None:
        self.sentences1 += other.sentences1
        self.sentences2 += other.sentences2
        self.gold += other.gold
        self.subsets += other.subsets

    def take(self, indices: Sequence[int]) -> SentencePairs:
        """The pairs at `indices`, in that order."""
        return SentencePairs(*([values[i] for i in indices]
                               for values in (self.sentences1, self.sentences2, self.gold, self.subsets)))

    def gold_array(self) -> np.ndarray:
        return np.asarray(self.gold, dtype=np.float64)


def read_utf8_text(path: Path) -> str:
    """The whole file decoded as strict UTF-8; an invalid byte is a `DataError` naming file:line (never replaced)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - raw.rfind(b"\n", 0, err.start)
        raise _invalid_utf8(path, line, column, raw[err.start], err.reason) from None


def invalid_utf8_error(path: Path) -> DataError:
    """The error `read_utf8_text` gives for `path`, found by reading the file a line at a time (for readers that
    stream a file and were stopped by a UnicodeDecodeError). A line split at b"\\n" decodes alone exactly as it does
    inside the file: no UTF-8 sequence contains that byte."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                return _invalid_utf8(path, number, err.start + 1, line[err.start], err.reason)
    return DataError(f"{path}: not valid UTF-8; re-save the file as UTF-8")  # (changed while being read)


def _invalid_utf8(path: Path, line: int, column: int, byte: int, reason: str) -> DataError:
    return DataError(f"{path}:{line}: not valid UTF-8 ({reason}: byte 0x{byte:02x} at byte {column} of the line); "
                     "re-save the file as UTF-8")


def _read_lines(path: Path) -> list[str]:
    return read_utf8_text(path).splitlines()


def _normalise(text: str, path: Path, lineno: int) -> str:
    sentence = " ".join(text.split())
    if not sentence:
        raise DataError(f"{path}:{lineno}: empty sentence")
    return sentence


def _score(text: str, path: Path, lineno: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise DataError(f"{path}:{lineno}: gold score {text!r} is not a number") from None


def read_sts_subset(input_path: Path, gold_path: Path, subset: str) -> SentencePairs:
    """One STS12-16 subset; pairs with a blank gold line are dropped, as SentEval does."""
    inputs, golds = _read_lines(input_path), _read_lines(gold_path)
    if len(inputs) != len(golds):
        raise DataError(
            f"{gold_path}: {len(golds)} gold lines but {input_path.name} has {len(inputs)} sentence pairs"
        )
    pairs = SentencePairs()
    for lineno, (line, gold) in enumerate(zip(inputs, golds), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{input_path}:{lineno}: expected 2 tab-separated sentences, found {len(fields)} fields")
        if not gold.strip():
            continue
        pairs.sentences1.append(_normalise(fields[0], input_path, lineno))
        pairs.sentences2.append(_normalise(fields[1], input_path, lineno))
        pairs.gold.append(_score(gold.strip(), gold_path, lineno))
        pairs.subsets.append(subset)
    return pairs


def _read_columns(path: Path, lines: list[str], first_lineno: int, min_fields: int, subset: str,
                  columns: tuple[int, int, int]) -> SentencePairs:
    """Tab-separated rows; `columns` = (sentence 1, sentence 2, gold score) field indices."""
    first, second, score = columns
    pairs = SentencePairs()
    for lineno, line in enumerate(lines, start=first_lineno):
        fields = line.strip().split("\t")
        if len(fields) < min_fields:
            raise DataError(
                f"{path}:{lineno}: expected at least {min_fields} tab-separated fields, found {len(fields)}"
            )
        pairs.sentences1.append(_normalise(fields[first], path, lineno))
        pairs.sentences2.append(_normalise(fields[second], path, lineno))
        pairs.gold.append(_score(fields[score], path, lineno))
        pairs.subsets.append(subset)
    return pairs


def read_stsb(path: Path, subset: str) -> SentencePairs:
    return _read_columns(path, _read_lines(path), 1, 7, subset, columns=(5, 6, 4))


def read_sick(path: Path, subset: str) -> SentencePairs:
    lines = _read_lines(path)
    if not lines or not lines[0].startswith("pair_ID"):
        raise DataError(f"{path}:1: expected the SICK header line starting with 'pair_ID'")
    return _read_columns(path, lines[1:], 2, 4, subset, columns=(1, 2, 3))


def read_sentences(path: Path) -> list[str]:
    """A text file with one sentence per line (no blank lines)."""
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    lines = _read_lines(path)
    if not lines:
        raise DataError(f"input file {path} is empty; it needs one sentence per line")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            raise DataError(f"{path}:{lineno}: empty sentence; remove blank lines")
    return lines
