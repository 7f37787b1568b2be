"""Pre-tokenized training corpora: sentence ids in an Arrow table (`datasets`, memory-mapped), built once per
(corpus, tokenizer, sentence rule, truncation length) and reused by every later run.

What is stored is the sentence part of each input only (sentence rule applied, tokenized without special tokens,
cut to one token more than the longest sentence any template of the model keeps, so truncation is still detected).
The template is added in the training step by offset (`InputBuilder.wrap_padded_ids`), so the cache does not depend
on the templates and the ids equal, token for token, what `InputBuilder.build` makes from the raw sentences. Loader
workers only read rows and pad them into one tensor; the main process moves it to the device.

The ids are written by `datasets`' `map` straight into the cache's staging folder (in contiguous shards across
`num_proc` processes for a large corpus, one `.arrow` file each), from a corpus table that is itself memory-mapped
(`corpus_tables.py`), so neither the text nor the ids are ever held in memory whole. The cache's record and checks
(sizes, hashes, rows; a damaged cache is rebuilt with one warning) are `table_cache.py`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from promptemb.data.corpus_tables import WRITE_BATCH, CorpusTable, TableRows
from promptemb.data.table_cache import cache_name, cached_table
from promptemb.data.tokenizing_workers import SentenceIds, TokenizingWorkers
from promptemb.encoder.inputs import InputBuilder

log = logging.getLogger(__name__)
#: Corpora smaller than this are tokenized in the main process: starting `num_proc` workers costs more.
PARALLEL_FROM_EXAMPLES = 50_000
#: Examples per batch tokenized and written (a list of examples; a corpus table gives its own record batches).
TOKENIZE_BATCH = 10_000
FORMAT_VERSION = 3  # bump when what is stored changes: old caches are then rebuilt, never misread


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

    def flat(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, ids) as `SentenceIds.flat` gives them."""
        ids = self(sentences)
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum([len(row) for row in ids], out=offsets[1:])
        return offsets, np.fromiter((t for row in ids for t in row), dtype=np.int32, count=int(offsets[-1]))

    def sentence_ids(self) -> SentenceIds | None:
        """The same ids from the fast tokenizer's backend alone (what worker processes run); None for a tokenizer
        without one."""
        tokenizer = self.builder.tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        return SentenceIds(backend.to_str(), bool(getattr(tokenizer, "split_special_tokens", False)),
                           self.builder.form.sentence_rule if self.builder.form.template is not None else None,
                           self.builder.sentence_leading_space, self.keep)

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


def pretokenized_corpus(examples, tokenization: SentenceTokenization, cache_dir: Path, num_proc: int | None = None,
                        verify: bool = False, corpus_key: str | None = None):
    """The memory-mapped `datasets.Dataset` of `examples` (columns `ids0`, `ids1`, ... one per sentence of an
    example), from the cache when this corpus was already tokenized this way and the cache checks out; else built
    (in `num_proc` processes for large corpora) and saved atomically, so concurrent ranks or runs never see half a
    cache. `examples`: a corpus table (`corpus_tables.CorpusTable`, keyed by its own cache key, which records the
    files' bytes and how examples were picked from them) or a list of strings / tuples of strings (keyed by their
    checksum). `verify`: hash the cache's files in full whatever their size."""
    described = {"corpus": examples.name} if isinstance(examples, CorpusTable) else {
        "corpus_sha256": corpus_sha256(examples)}
    key = {**described, "examples": len(examples), **tokenization.fingerprint()}
    folder = Path(cache_dir) / "pretokenized" / cache_name(key)
    table, _ = cached_table(folder, key, lambda staging: tokenize_into(staging, examples, tokenization, num_proc),
                            verify=verify, label="pre-tokenized cache")
    return table


def tokenize_into(staging: Path, examples, tokenization: SentenceTokenization, num_proc: int | None) -> dict:
    """Write the ids of `examples` into `staging/ids.arrow`, a batch at a time: a corpus table is streamed from its
    files (never mapped whole into this process), tokenized in `num_proc` worker processes when it is large and the
    tokenizer is a fast one (`tokenizing_workers.py`), else here."""
    import datasets
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter
    from datasets.utils.tqdm import tqdm

    if isinstance(examples, CorpusTable):
        slots, batches = examples.slots, examples.text_batches(TOKENIZE_BATCH)
    else:
        slots = 1 if isinstance(examples[0], str) else len(examples[0])
        batches = ([[e if slots == 1 else e[k] for e in examples[start : start + TOKENIZE_BATCH]] for k in range(slots)]
                   for start in range(0, len(examples), TOKENIZE_BATCH))
    features = datasets.Features({f"ids{k}": datasets.Sequence(datasets.Value("int32")) for k in range(slots)})
    ids = tokenization.sentence_ids()
    parallel = num_proc if ids is not None and num_proc and num_proc > 1 and len(
        examples) >= PARALLEL_FROM_EXAMPLES else None
    log.info("pre-tokenizing %d examples into %s%s", len(examples), staging.parent,
             f" ({parallel} processes)" if parallel else "")
    with contextlib.ExitStack() as stack:
        if parallel:
            flat_batches = stack.enter_context(TokenizingWorkers(ids, parallel)).map(batches)
        else:
            flat = ids.flat if ids is not None else tokenization.flat
            flat_batches = ([flat(column) for column in batch] for batch in batches)
        writer = stack.enter_context(ArrowWriter(features=features, path=str(staging / "ids.arrow"),
                                                 writer_batch_size=WRITE_BATCH))
        bar = stack.enter_context(tqdm(total=len(examples), unit=" examples", desc="pre-tokenizing"))
        tables, rows = [], 0  # written WRITE_BATCH rows at a time: record batches as large as the corpus table's
        for columns in flat_batches:
            arrays = [pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)) for offsets, values in columns]
            tables.append(pa.table(arrays, names=list(features)))
            rows += len(arrays[0])
            bar.update(len(arrays[0]))
            if rows >= WRITE_BATCH:
                writer.write_table(pa.concat_tables(tables))
                tables, rows = [], 0
        if tables:
            writer.write_table(pa.concat_tables(tables))
        writer.finalize()
    return {}


class PretokenizedExamples(TableRows):
    """Rows of a pre-tokenized table (columns `ids0`, `ids1`, ...): a list of ids, or a tuple of them, per example."""

    def __init__(self, table):
        super().__init__(table, "ids")

    def sentence_lengths(self) -> list:
        """Stored ids per sentence: one Arrow array per column (sentence slot of an example)."""
        import pyarrow.compute as pc

        return [pc.list_value_length(self.table.data.column(column)) for column in self.columns]

    def example_lengths(self) -> np.ndarray:
        """Stored ids per example, over all its sentences."""
        import pyarrow.compute as pc

        lengths = self.sentence_lengths()
        total = lengths[0]
        for other in lengths[1:]:
            total = pc.add(total, other)
        return total.to_numpy().astype(np.int64)

    def count_longer_than(self, tokens: int) -> int:
        """Sentences (over every column) stored with more than `tokens` ids."""
        import pyarrow.compute as pc

        return sum(int(pc.sum(pc.greater(lengths, tokens)).as_py() or 0) for lengths in self.sentence_lengths())



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
