"""Training corpora: text lines, NLI triplet CSVs, SICK-train triplets, and the guard against evaluation leakage.

The readers stream: a file is read a line (or csv row) at a time, never whole, so a corpus larger than memory goes
through them (`corpus_tables.py` writes what they yield into an Arrow table in batches). `read_text_lines` and
`read_nli_csv` are the same readers collected into a list, for small corpora."""

from __future__ import annotations

import csv
import hashlib
import io
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from promptemb.common.errors import DataError
from promptemb.data.readers import invalid_utf8_error, read_sick, read_stsb, read_utf8_text
from promptemb.data.tasks import get_tasks

NLI_COLUMNS = ("sent0", "sent1", "hard_neg")
#: Sentences never trained on: every STS test set, STS-B dev (model selection), SICK-R test, and every sentence of
#: every transfer and clustering task (all splits: a transfer score depends on its classifier's training text too).
HELD_OUT_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "STSBenchmark-dev", "SICKRelatedness",
                  "MR", "CR", "SUBJ", "MPQA", "SST2", "SST5", "TREC", "MRPC", "SICK-E",
                  "agnews", "biomedical", "googlenews-TS", "googlenews-T", "googlenews-S", "searchsnippets",
                  "stackoverflow", "tweet")


def normalise_for_matching(sentence: str) -> str:
    return " ".join(sentence.lower().split())


@dataclass(frozen=True)
class HeldOut:
    """The normalised sentences of the held-out tasks, each with a bit mask of the tasks (`tasks[i]` is bit i) whose
    text it is, and a sha256 of the whole set (what a cached corpus filtered against it records)."""

    tasks: tuple[str, ...]
    sentences: dict[str, int]
    sha256: str

    def tasks_of(self, sentences: Iterable[str]) -> int:
        """The mask of the tasks sharing a sentence with `sentences` (0: none, the example is kept)."""
        mask = 0
        for sentence in sentences:
            mask |= self.sentences.get(normalise_for_matching(sentence), 0)
        return mask

    def names(self, mask: int) -> list[str]:
        return [task for bit, task in enumerate(self.tasks) if mask >> bit & 1]


def held_out_sentences(root: Path, tasks: Iterable[str] = HELD_OUT_TASKS) -> HeldOut:
    """The normalised sentences of `tasks` (task names or groups such as `transfer`), any family."""
    return _held_out(str(root), tuple(tasks))


@cache  # read once per process: every datamodule of a test session or a sweep filters against the same sets
def _held_out(root: str, tasks: tuple[str, ...]) -> HeldOut:
    held: dict[str, int] = {}
    specs = get_tasks(list(tasks))
    for bit, spec in enumerate(specs):
        for sentence in spec.sentences(Path(root)):
            key = normalise_for_matching(sentence)
            held[key] = held.get(key, 0) | 1 << bit
    digest = hashlib.sha256()
    for sentence in sorted(held):
        digest.update(sentence.encode())
        digest.update(b"\n")
    return HeldOut(tuple(spec.name for spec in specs), held, digest.hexdigest())


def utf8_lines(path: Path, newline: str | None = None, progress: Callable[[int], object] | None = None,
               ) -> Iterator[str]:
    """The lines of a file decoded as strict UTF-8, a buffer at a time (`open`'s `newline` rule: None ends lines at
    \\n, \\r\\n or \\r and yields them as \\n); an invalid byte is a `DataError` naming file:line, as
    `read_utf8_text` names it. `progress(n)`: called now and then with the bytes read since its last call."""
    try:
        with path.open(encoding="utf-8", newline=newline) as handle:
            if progress is None:
                yield from handle
                return
            done = 0
            for number, line in enumerate(handle):
                if number % PROGRESS_EVERY == 0:
                    position = handle.buffer.tell()
                    progress(position - done)
                    done = position
                yield line
            progress(path.stat().st_size - done)
    except UnicodeDecodeError:
        raise invalid_utf8_error(path) from None


#: Lines between two progress reports of `utf8_lines`.
PROGRESS_EVERY = 1 << 16


def check_corpus_files(paths: Iterable[Path]) -> None:
    for path in paths:
        if not path.is_file():
            raise DataError(f"corpus file {path} does not exist; check data.files and data_root")


def iter_text_lines(paths: Iterable[Path], progress: Callable[[int], object] | None = None) -> Iterator[str]:
    """Non-blank lines of every file, stripped, streamed; a missing file, an invalid UTF-8 byte (named as file:line)
    or an empty corpus is an error. `progress`: as in `utf8_lines`."""
    paths = list(paths)
    check_corpus_files(paths)
    empty = True
    for path in paths:
        for line in utf8_lines(path, progress=progress):
            line = line.strip()
            if line:
                empty = False
                yield line
    if empty:
        raise DataError(f"empty corpus: no non-blank line in {', '.join(str(p) for p in paths)}")


def read_text_lines(paths: Iterable[Path]) -> list[str]:
    """`iter_text_lines` as a list (small corpora)."""
    return list(iter_text_lines(paths))


def _check_nli_columns(path: Path, header: list[str] | None) -> None:
    missing = [c for c in NLI_COLUMNS if c not in (header or [])]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)}; expected a header "
                        f"{','.join(NLI_COLUMNS)} (found {','.join(header or []) or 'no header'})")


def check_nli_header(path: Path) -> None:
    """The columns of an NLI csv from its header line alone (before any model is loaded)."""
    if not path.is_file():
        raise DataError(f"NLI file {path} does not exist; check data.file and data_root")
    with path.open("rb") as handle:
        first = handle.readline()
    try:
        header = next(csv.reader([first.decode("utf-8")]), None)
    except UnicodeDecodeError as err:
        raise DataError(f"{path}:1: not valid UTF-8 ({err.reason}); re-save the file as UTF-8") from None
    _check_nli_columns(path, header)


def iter_nli_csv(path: Path, progress: Callable[[int], object] | None = None) -> Iterator[tuple[str, str, str]]:
    """SimCSE's NLI format: header `sent0,sent1,hard_neg`, one triplet per row, streamed (`progress`: as in
    `utf8_lines`)."""
    if not path.is_file():
        raise DataError(f"NLI file {path} does not exist; check data.file and data_root")
    reader = csv.DictReader(utf8_lines(path, newline="", progress=progress))
    _check_nli_columns(path, reader.fieldnames)
    empty = True
    for lineno, row in enumerate(reader, start=2):
        values = tuple((row[c] or "").strip() for c in NLI_COLUMNS)
        if not all(values):
            raise DataError(f"{path}:{lineno}: empty field in a triplet")
        empty = False
        yield values
    if empty:
        raise DataError(f"empty corpus: {path} has a header but no triplets")


def read_nli_csv(path: Path) -> list[tuple[str, str, str]]:
    """`iter_nli_csv` as a list (small corpora)."""
    return list(iter_nli_csv(path))


#: Scored-pair corpora: format -> (reader, the line of the file its first pair is on). `stsb`: the STS-B csv layout
#: (score in column 4, sentences in 5 and 6); `sick_relatedness`: SICK's (header, relatedness score in column 3).
SCORED_PAIR_READERS = {"stsb": (read_stsb, 1), "sick_relatedness": (read_sick, 2)}


def scored_pairs(path: Path, format: str) -> list[tuple[str, str, float]]:
    """(sentence 1, sentence 2, gold score) of every pair of a scored-pair file, sentences whitespace-normalised as
    the STS readers normalise them (the file is small: read whole)."""
    if not path.is_file():
        raise DataError(f"scored-pair file {path} does not exist; check data.file and data_root")
    reader, _ = SCORED_PAIR_READERS[format]
    pairs = reader(path, "train")
    if not len(pairs):
        raise DataError(f"empty corpus: no scored pair in {path}")
    return list(zip(pairs.sentences1, pairs.sentences2, pairs.gold, strict=True))


def sick_triplets(path: Path) -> list[tuple[str, str, str]]:
    """(premise, entailed, contradicted) from SICK train.

    Every ENTAILMENT pair (A, B) is a (premise, positive); its hard negative is a sentence in a CONTRADICTION pair
    with A or with B (contradiction is symmetric), the i-th triplet taking the (i mod k)-th of the k candidates in
    sorted order, so the result is deterministic. Pairs with no contradiction partner are skipped.
    """
    entails, contradicts = defaultdict(set), defaultdict(set)
    with io.StringIO(read_utf8_text(path), newline=None) as handle:
        header = handle.readline().rstrip("\n").split("\t")
        if header[:5] != ["pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment"]:
            raise DataError(f"{path}:1: not a SICK file (header {header[:5]})")
        for lineno, line in enumerate(handle, start=2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 5:
                raise DataError(f"{path}:{lineno}: expected at least 5 tab-separated fields, found {len(fields)}")
            first, second, label = fields[1].strip(), fields[2].strip(), fields[4].strip()
            if label == "ENTAILMENT":
                entails[first].add(second)
            elif label == "CONTRADICTION":
                contradicts[first].add(second)
                contradicts[second].add(first)
    triplets: list[tuple[str, str, str]] = []
    for premise, positives in entails.items():
        for positive in sorted(positives):
            negatives = sorted(contradicts.get(premise, set()) | contradicts.get(positive, set()))
            if negatives:
                triplets.append((premise, positive, negatives[len(triplets) % len(negatives)]))
    if not triplets:
        raise DataError(f"empty corpus: no entailment pair in {path} has a contradiction partner")
    return triplets
