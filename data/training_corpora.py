"""Training corpora: text lines, NLI triplet CSVs, SICK-train triplets, and the guard against evaluation leakage."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from promptemb.common.errors import DataError
from promptemb.data.readers import read_utf8_text
from promptemb.data.tasks import CLUSTERING_SUITE, TRANSFER_SUITE, get_tasks

NLI_COLUMNS = ("sent0", "sent1", "hard_neg")
#: Sentences never trained on: every STS test set, STS-B dev (model selection), SICK-R test, and every sentence of
#: every transfer and clustering task (all splits: a transfer score depends on its classifier's training text too).
HELD_OUT_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "STSBenchmark-dev", "SICKRelatedness",
                  *TRANSFER_SUITE, *CLUSTERING_SUITE)


def normalise_for_matching(sentence: str) -> str:
    return " ".join(sentence.lower().split())


def held_out_sentences(root: Path, tasks: Iterable[str] = HELD_OUT_TASKS) -> frozenset[str]:
    """Normalised sentences of `tasks` (task names or groups such as `transfer`), any family."""
    return _held_out(str(root), tuple(tasks))


@cache  # read once per process: every datamodule of a test session or a sweep filters against the same sets
def _held_out(root: str, tasks: tuple[str, ...]) -> frozenset[str]:
    held = set()
    root = Path(root)
    for spec in get_tasks(list(tasks)):
        if spec.family == "sts":
            pairs = spec.load(root)
            held.update(normalise_for_matching(s) for s in pairs.sentences1 + pairs.sentences2)
        else:
            for split in spec.load_labeled(root).values():
                held.update(normalise_for_matching(s) for s in split.all_sentences())
    return frozenset(held)


def read_text_lines(paths: Iterable[Path]) -> list[str]:
    """Non-blank lines of every file, stripped; a missing file, an invalid UTF-8 byte (named as file:line) or an
    empty corpus is an error."""
    sentences: list[str] = []
    for path in paths:
        if not path.is_file():
            raise DataError(f"corpus file {path} does not exist; check data.files and data_root")
        # newline=None: lines end at \n, \r\n or \r, as when the file is opened in text mode
        sentences += [line.strip() for line in io.StringIO(read_utf8_text(path), newline=None) if line.strip()]
    if not sentences:
        raise DataError(f"empty corpus: no non-blank line in {', '.join(str(p) for p in paths)}")
    return sentences


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


def read_nli_csv(path: Path) -> list[tuple[str, str, str]]:
    """SimCSE's NLI format: header `sent0,sent1,hard_neg`, one triplet per row."""
    if not path.is_file():
        raise DataError(f"NLI file {path} does not exist; check data.file and data_root")
    with io.StringIO(read_utf8_text(path), newline="") as handle:
        reader = csv.DictReader(handle)
        _check_nli_columns(path, reader.fieldnames)
        triplets = []
        for lineno, row in enumerate(reader, start=2):
            values = tuple((row[c] or "").strip() for c in NLI_COLUMNS)
            if not all(values):
                raise DataError(f"{path}:{lineno}: empty field in a triplet")
            triplets.append(values)
    if not triplets:
        raise DataError(f"empty corpus: {path} has a header but no triplets")
    return triplets


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
