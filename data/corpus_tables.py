"""Training corpora as memory-mapped Arrow tables, read from their files in one streaming pass and cached by the
files' bytes.

One pass reads the examples (text lines, NLI csv rows or SICK triplets, exactly as `training_corpora` reads them),
drops every example sharing a sentence with a held-out evaluation task (counted per task), keeps the first
`max_examples` of the rest and writes them in batches with `datasets`' `ArrowWriter` (the writer its builders use),
so memory stays bounded whatever the corpus size. The table is cached under `<cache>/corpora/<key>` by the size and
sha256 of every file (in order), the format, the held-out sentences and `max_examples`, with `table_cache.py`'s
record and checks; later runs, and the other ranks of a node, open it memory-mapped instead of reading the files.

Why not the `text` and `csv` builders of `datasets`: the csv builder parses with pandas, which reads fields such as
`NA` or `null` as missing values and quotes differently from Python's csv module, so an existing NLI corpus would
give other triplets; the `text` builder splits lines as we do, but writes a raw copy of every line that a second pass
would then have to strip and filter into a third. The readers here are the ones the corpora were always read with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from promptemb.common.errors import DataError
from promptemb.data.checksums import sha256_file
from promptemb.data.table_cache import cache_name, cached_table
from promptemb.data.training_corpora import (
    HeldOut,
    check_corpus_files,
    iter_nli_csv,
    iter_text_lines,
    normalise_for_matching,
    scored_pairs,
    sick_triplets,
)

if TYPE_CHECKING:
    import datasets

#: Bump when what is read from a file or how it is stored changes: old corpus caches are then rebuilt, never misread.
CORPUS_FORMAT = 1
#: Examples per record batch of a corpus table and of its pre-tokenized ids (and the most held in memory while
#: writing). Large on purpose: opening a memory-mapped Arrow stream reads every record batch's header, and the kernel
#: maps the pages around each header it touches (fault-around, 64 KiB), so small batches would leave a share of the
#: whole file in the process's RSS (about half of it at 1,000 rows of ids; 5% at 10,000; 0.5% at 100,000).
WRITE_BATCH = 100_000
SLOTS = {"lines": 1, "nli_csv": 3, "sick": 3, "stsb": 2, "sick_relatedness": 2}
#: Formats whose examples carry a gold score after their sentences, stored in the table's `score` column.
SCORED_FORMATS = ("stsb", "sick_relatedness")


@dataclass(frozen=True)
class CorpusSource:
    """What a corpus table is made from: the files in order, their format (`lines`: one sentence per non-blank line;
    `nli_csv`: SimCSE's sent0,sent1,hard_neg csv; `sick`: triplets built from SICK train; `stsb`, `sick_relatedness`:
    sentence pairs with a gold score, `training_corpora.SCORED_PAIR_READERS`), the held-out sentences
    (None: nothing held out) and how many of the kept examples to keep. `formats`: scored-pair files of different
    layouts read into one corpus (STS-B and SICK-R train), each path's own format (`format` is then the first)."""

    format: str
    paths: tuple[Path, ...]
    held_out: HeldOut | None = None
    max_examples: int | None = None
    formats: tuple[str, ...] | None = None

    @property
    def slots(self) -> int:
        return SLOTS[self.format]

    def check_files(self) -> None:
        """Every file exists (the readers' own message, before anything is hashed or read)."""
        if self.format == "lines":
            check_corpus_files(self.paths)
            return
        for path in self.paths:
            if not path.is_file():
                kind = {"nli_csv": "NLI", "sick": "SICK"}.get(self.format, "scored-pair")
                raise DataError(f"{kind} file {path} does not exist; check data.file and data_root")

    def key(self) -> dict:
        """What the examples depend on: the files' bytes, how they are read, what is dropped and kept."""
        self.check_files()
        held = self.held_out
        return {"kind": "corpus", "corpus_format": CORPUS_FORMAT, "format": self.format,
                "source_files": [{"bytes": path.stat().st_size, "sha256": sha256_file(path)} for path in self.paths],
                "held_out_tasks": list(held.tasks) if held else [], "held_out_sha256": held.sha256 if held else None,
                "max_examples": self.max_examples, **({"formats": list(self.formats)} if self.formats else {})}

    def examples(self, progress=None) -> Iterator:
        """Every example of the files, unfiltered, streamed (SICK train, a small file, is read whole to pair its
        sentences). `progress(n)`: called with the bytes read since its last call."""
        if self.format == "lines":
            return iter_text_lines(self.paths, progress=progress)
        if self.format == "nli_csv":
            return (example for path in self.paths for example in iter_nli_csv(path, progress=progress))
        if self.format in SCORED_FORMATS:
            formats = self.formats or (self.format,) * len(self.paths)
            return (example for path, fmt in zip(self.paths, formats, strict=True)
                    for example in _read_whole(path, lambda p, fmt=fmt: scored_pairs(p, fmt), progress))
        return (example for path in self.paths for example in _read_whole(path, sick_triplets, progress))


def _read_whole(path: Path, reader, progress=None) -> list:
    examples = reader(path)
    if progress is not None:
        progress(path.stat().st_size)
    return examples


class TooFewExamplesError(DataError):
    """Fewer examples kept than asked for; `counts` says how many were read, dropped (per held-out task) and kept."""

    def __init__(self, counts: dict, minimum: int):
        super().__init__(f"corpus has {counts['examples']} examples after filtering, fewer than {minimum}")
        self.counts = counts
        self.minimum = minimum


@dataclass
class CorpusTable:
    """A corpus table (`datasets.Dataset`, columns `text0`, `text1`, ... one per sentence of an example), its cache
    name (what a table derived from it, such as its pre-tokenized ids, is keyed by) and the counts of the pass that
    built it (`read`, `dropped_held_out`, `dropped_by_task`, `examples`)."""

    table: datasets.Dataset
    name: str
    counts: dict = field(default_factory=dict)

    @property
    def slots(self) -> int:
        return len(self.columns)

    def scores(self) -> np.ndarray | None:
        """The gold score of every example of a scored-pair corpus (float64), None for other corpora."""
        if "score" not in self.table.column_names:
            return None
        return self.table.data.column("score").to_numpy().astype(np.float64)

    @property
    def columns(self) -> list[str]:
        return sorted((c for c in self.table.column_names if c.startswith("text")), key=lambda c: int(c[4:]))

    def __len__(self) -> int:
        return len(self.table)

    def text_batches(self, rows: int) -> Iterator[list[list[str]]]:
        """The examples `rows` at a time (a list of sentences per column), read from the table's files a record batch
        at a time with plain reads: unlike the memory map, nothing read stays mapped into this process."""
        import pyarrow as pa

        for entry in self.table.cache_files:
            with pa.OSFile(entry["filename"]) as source:
                for batch in pa.ipc.open_stream(source):
                    columns = [batch.column(batch.schema.get_field_index(c)) for c in self.columns]
                    for start in range(0, batch.num_rows, rows):
                        yield [column.slice(start, rows).to_pylist() for column in columns]


def corpus_table(source: CorpusSource, cache_dir: Path, minimum_examples: int = 1,
                 verify: bool = False) -> CorpusTable:
    """The corpus table of `source`, from the cache when it checks out, else read and cached. Fewer than
    `minimum_examples` kept is `TooFewExamplesError` (and nothing is cached)."""
    key = source.key()
    name = cache_name(key)
    table, record = cached_table(Path(cache_dir) / "corpora" / name, key,
                                 lambda staging: write_corpus(staging, source, minimum_examples), verify=verify,
                                 label="corpus cache")
    counts = {k: record.get(k) for k in ("read", "dropped_held_out", "dropped_by_task")} | {"examples": len(table)}
    if len(table) < minimum_examples:
        raise TooFewExamplesError(counts, minimum_examples)
    return CorpusTable(table, name, counts)


def write_corpus(staging: Path, source: CorpusSource, minimum_examples: int) -> dict:
    """Read `source` once into `staging/corpus.arrow`, WRITE_BATCH examples at a time; the counts of the pass."""
    import datasets
    from datasets.arrow_writer import ArrowWriter
    from datasets.utils.tqdm import tqdm

    slots, held, limit = source.slots, source.held_out, source.max_examples
    scored = source.format in SCORED_FORMATS  # (sentence, ..., score): the score goes to its own column
    held_sentences = held.sentences if held is not None else {}
    features = datasets.Features({f"text{k}": datasets.Value("string") for k in range(slots)}
                                 | ({"score": datasets.Value("float64")} if scored else {}))
    read = kept = dropped = 0
    by_task = [0] * (len(held.tasks) if held is not None else 0)
    columns: list[list[str]] = [[] for _ in range(slots)]
    scores: list[float] = []

    def batch() -> dict:
        return {f"text{k}": column for k, column in enumerate(columns)} | ({"score": scores} if scored else {})

    total = sum(path.stat().st_size for path in source.paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc="reading corpus") as bar, \
            ArrowWriter(features=features, path=str(staging / "corpus.arrow"), writer_batch_size=WRITE_BATCH) as writer:
        for example in source.examples(progress=bar.update):
            read += 1
            if scored:
                *example, score = example
            if held_sentences:
                if slots == 1:
                    mask = held_sentences.get(normalise_for_matching(example), 0)
                else:
                    mask = 0
                    for sentence in example:
                        mask |= held_sentences.get(normalise_for_matching(sentence), 0)
                if mask:  # counted per task; the example is dropped
                    dropped += 1
                    for bit in range(mask.bit_length()):
                        by_task[bit] += mask >> bit & 1
                    continue
            if limit is not None and kept >= limit:  # read on: the held-out count is over the whole corpus
                continue
            kept += 1
            if slots == 1:
                columns[0].append(example)
            else:
                for column, sentence in zip(columns, example, strict=True):
                    column.append(sentence)
            if scored:
                scores.append(score)
            if len(columns[0]) >= WRITE_BATCH:
                writer.write_batch(batch())
                columns, scores = [[] for _ in range(slots)], []
        if columns[0]:
            writer.write_batch(batch())
        writer.finalize()
    counts = {"read": read, "dropped_held_out": dropped, "examples": kept,
              "dropped_by_task": {task: n for task, n in zip(held.tasks, by_task, strict=True) if n} if held else {}}
    if kept < minimum_examples:
        raise TooFewExamplesError(counts, minimum_examples)
    return counts


class TableRows(torch.utils.data.Dataset):
    """The examples of a table whose columns `<prefix>0`, `<prefix>1`, ... hold the sentences of each example, as the
    loader reads them: one value, or a tuple of values, per example; a whole batch of indices is read in one Arrow
    `take` (`__getitems__`)."""

    def __init__(self, table, prefix: str):
        self.table = table
        self.columns = sorted((c for c in table.column_names if c.startswith(prefix)),
                              key=lambda c: int(c[len(prefix):]))

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list:
        rows = self.table[list(indices)]
        if len(self.columns) == 1:
            return rows[self.columns[0]]
        return list(zip(*(rows[c] for c in self.columns), strict=True))


class CorpusRows(TableRows):
    """The examples of a corpus table: a string, or a tuple of strings, per example."""

    def __init__(self, corpus: CorpusTable):
        super().__init__(corpus.table, "text")

    def __iter__(self) -> Iterator:
        for batch in self.table.iter(batch_size=WRITE_BATCH):
            if len(self.columns) == 1:
                yield from batch[self.columns[0]]
            else:
                yield from zip(*(batch[c] for c in self.columns), strict=True)

    def lengths(self) -> np.ndarray:
        """Characters per example, over all its sentences (what length grouping sorts raw sentences by)."""
        import pyarrow.compute as pc

        total = None
        for column in self.columns:
            length = pc.utf8_length(self.table.data.column(column))
            total = length if total is None else pc.add(total, length)
        return total.to_numpy().astype(np.int64)

    def first_sentence_ids(self) -> np.ndarray:
        """Equal for examples whose first sentence is the same text: each distinct text's index in order of first
        appearance."""
        import pyarrow as pa
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(self.table.data.column(self.columns[0]))
        return pa.chunked_array([chunk.indices for chunk in encoded.chunks], type=pa.int32()).to_numpy().astype(
            np.int64)
