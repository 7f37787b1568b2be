"""Pre-tokenized training corpora: sentence ids in an Arrow table (`datasets`, memory-mapped), built once per
(corpus checksum, tokenizer, sentence rule, truncation length) and reused by every later run.

What is stored is the sentence part of each input only (sentence rule applied, tokenized without special tokens,
cut to one token more than the longest sentence any template of the model keeps, so truncation is still detected).
The template is added in the training step by offset (`InputBuilder.wrap_padded_ids`), so the cache does not depend
on the templates and the ids equal, token for token, what `InputBuilder.build` makes from the raw sentences. Loader
workers only read rows and pad them into one tensor; the main process moves it to the device.

A cache records its row count and the size and sha256 of each of its files (`key.json`, written last: a folder
without it is no cache). Every open checks the sizes, the hashes of each file's first and last MiB and the row count,
and the full hashes when the cache is small enough to hash in well under a second, when it was just built, or on
request (`verify=True`); a damaged cache
(truncated, overwritten, zeroed blocks) is moved aside and rebuilt with a one-line warning, never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from promptemb.data.checksums import sha256_file
from promptemb.encoder.inputs import InputBuilder

log = logging.getLogger(__name__)
#: Corpora smaller than this are tokenized in the main process: starting `num_proc` workers costs more.
PARALLEL_FROM_EXAMPLES = 50_000
FORMAT_VERSION = 2  # bump when what is stored changes: old caches are then rebuilt, never misread
#: Caches up to this size are hashed in full on every open (about 0.3 s); larger ones when built or on request.
FULL_CHECK_BYTES = 256 << 20
#: Of a larger cache, every open hashes this much of each file's start and end (the Arrow schema and the first and
#: last record batches: a file overwritten or replaced is caught without reading it all).
EDGE_BYTES = 1 << 20
RECORD_FILE = "key.json"


@dataclass(frozen=True)
class SentenceTokenization:
    """How a module turns training sentences into the ids it stores: `builder`'s tokenizer and sentence rule,
    ids cut to `keep` tokens."""

    builder: InputBuilder
    keep: int

    @classmethod
    def for_builders(cls, builders: Sequence[InputBuilder]) -> SentenceTokenization:
        rules = {(builder.form.sentence_rule, builder.sentence_leading_space) for builder in builders}
        if len(rules) != 1 or any(b.tokenizer is not builders[0].tokenizer for b in builders):
            raise ValueError("pre-tokenized data needs one tokenizer, one sentence rule and one spacing before the "
                             "sentence for every view")
        return cls(builders[0], max(builder.max_sentence_tokens for builder in builders) + 1)

    def __call__(self, sentences: list[str]) -> list[list[int]]:
        return [ids[: self.keep] for ids in self.builder.tokenize_sentences(sentences)]

    def fingerprint(self) -> dict:
        tokenizer = self.builder.tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # the fast tokenizer's full serialisation (vocabulary, normaliser, pre-tokenizer); else the vocabulary
        described = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
        return {"format": FORMAT_VERSION, "tokenizer_class": type(tokenizer).__name__,
                "tokenizer_sha256": hashlib.sha256(described.encode()).hexdigest(),
                "sentence_rule": self.builder.form.sentence_rule if self.builder.form.template else "none",
                "keep_tokens": self.keep,
                # only when set, so caches of every other template keep their names
                **({"sentence_leading_space": True} if self.builder.sentence_leading_space else {})}


def corpus_sha256(examples: Sequence[str | Sequence[str]]) -> str:
    """Checksum of the examples as trained on (after held-out filtering and `max_examples`), in order."""
    digest = hashlib.sha256()
    for example in examples:
        fields = (example,) if isinstance(example, str) else tuple(example)
        digest.update("\x1f".join(fields).encode())
        digest.update(b"\x1e")
    return digest.hexdigest()


def pretokenized_corpus(examples: Sequence[str | Sequence[str]], tokenization: SentenceTokenization,
                        cache_dir: Path, num_proc: int | None = None, verify: bool = False):
    """The memory-mapped `datasets.Dataset` of `examples` (columns `ids0`, `ids1`, ... one per sentence of an
    example), from the cache when this corpus was already tokenized this way and the cache checks out; else built
    (in `num_proc` processes for large corpora) and saved atomically, so concurrent ranks or runs never see half a
    cache. `verify`: hash the cache's files in full whatever their size."""
    key = {"corpus_sha256": corpus_sha256(examples), "examples": len(examples), **tokenization.fingerprint()}
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    final = Path(cache_dir) / "pretokenized" / name
    if (final / RECORD_FILE).is_file():
        table, problem = open_checked(final, key, full=verify)
        if table is not None:
            return table
        log.warning("pre-tokenized cache %s is damaged (%s); rebuilding it", final, problem)
        move_aside(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    build(examples, tokenization, key, final, num_proc)
    table, problem = open_checked(final, key, full=True)
    if table is None:  # what was just written (by us or a concurrent builder) does not read back: the disk is at fault
        raise OSError(f"the pre-tokenized cache {final} just written does not read back ({problem}); check the disk "
                      f"holding {cache_dir}")
    return table


def build(examples, tokenization: SentenceTokenization, key: dict, final: Path, num_proc: int | None) -> None:
    """Tokenize into a staging folder beside `final`, record rows and file hashes, rename it to `final`. A concurrent
    builder that renamed first wins; ours is discarded."""
    import datasets

    slots = 1 if isinstance(examples[0], str) else len(examples[0])
    columns = {f"text{k}": [e if slots == 1 else e[k] for e in examples] for k in range(slots)}
    features = datasets.Features({f"ids{k}": datasets.Sequence(datasets.Value("int32")) for k in range(slots)})
    parallel = num_proc if num_proc and num_proc > 1 and len(examples) >= PARALLEL_FROM_EXAMPLES else None
    log.info("pre-tokenizing %d examples into %s%s", len(examples), final,
             f" ({parallel} processes)" if parallel else "")
    table = datasets.Dataset.from_dict(columns).map(
        _Tokenize(tokenization, slots), batched=True, batch_size=1000, num_proc=parallel,
        remove_columns=list(columns), features=features, desc="pre-tokenizing", load_from_cache_file=False)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".staging", dir=final.parent))
    try:
        table.save_to_disk(str(staging))
        files = {path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path, cached=False),
                             "edges_sha256": edges_sha256(path)}
                 for path in sorted(staging.iterdir()) if path.is_file()}
        record = {**key, "rows": len(table), "files": files}
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))
        os.rename(staging, final)
    except OSError:
        if not (final / RECORD_FILE).is_file():  # not a concurrent build that finished first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
        return None, f"{RECORD_FILE} does not describe this corpus"
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
    """(the table, None) when the cache at `folder` checks out (files, then rows as loaded), else (None, why)."""
    import datasets

    record, problem = check_files(folder, key, full)
    if record is None:
        return None, problem
    try:
        table = datasets.load_from_disk(str(folder))
    except Exception as err:  # pyarrow and datasets raise many kinds for a damaged table
        return None, f"it does not load ({type(err).__name__})"
    if len(table) != record["rows"]:
        return None, f"{len(table)} rows, not the {record['rows']} written"
    return table, None


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


class _Tokenize:
    """The `map` function (a class, so `num_proc` workers can pickle it)."""

    def __init__(self, tokenization: SentenceTokenization, slots: int):
        self.tokenization = tokenization
        self.slots = slots

    def __call__(self, batch: dict) -> dict:
        return {f"ids{k}": self.tokenization(batch[f"text{k}"]) for k in range(self.slots)}


class PretokenizedExamples(torch.utils.data.Dataset):
    """Rows of a pre-tokenized table; a whole batch of indices is read in one Arrow `take` (`__getitems__`)."""

    def __init__(self, table):
        self.table = table
        self.columns = sorted((c for c in table.column_names if c.startswith("ids")), key=lambda c: int(c[3:]))

    def __len__(self) -> int:
        return len(self.table)

    def sentence_lengths(self) -> list:
        """Stored ids per sentence: one Arrow array per column (sentence slot of an example)."""
        import pyarrow.compute as pc

        return [pc.list_value_length(self.table.data.column(column)) for column in self.columns]

    def example_lengths(self) -> list[int]:
        """Stored ids per example, over all its sentences."""
        import pyarrow.compute as pc

        lengths = self.sentence_lengths()
        total = lengths[0]
        for other in lengths[1:]:
            total = pc.add(total, other)
        return total.to_pylist()

    def count_longer_than(self, tokens: int) -> int:
        """Sentences (over every column) stored with more than `tokens` ids."""
        import pyarrow.compute as pc

        return sum(int(pc.sum(pc.greater(lengths, tokens)).as_py() or 0) for lengths in self.sentence_lengths())

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list:
        rows = self.table[list(indices)]
        if len(self.columns) == 1:
            return rows[self.columns[0]]
        return list(zip(*(rows[c] for c in self.columns), strict=True))


def pad_sentence_ids(examples: list) -> dict[str, torch.Tensor]:
    """Collate pre-tokenized examples: {"ids": [B, L] or [B, S, L] (S sentences per example, zero-padded),
    "lengths": [B] or [B, S]}. The batch stays splittable along its first axis (gradient caching)."""
    single = not examples or not isinstance(examples[0], tuple)
    rows = examples if single else [ids for example in examples for ids in example]
    lengths = np.fromiter((len(ids) for ids in rows), dtype=np.int64, count=len(rows))
    padded = np.zeros((len(rows), int(lengths.max()) if len(rows) else 0), dtype=np.int64)
    for row, ids in enumerate(rows):
        padded[row, : len(ids)] = ids
    ids_t, lengths_t = torch.from_numpy(padded), torch.from_numpy(lengths)
    if not single:
        slots = len(examples[0])
        ids_t, lengths_t = ids_t.view(len(examples), slots, -1), lengths_t.view(len(examples), slots)
    return {"ids": ids_t, "lengths": lengths_t}
