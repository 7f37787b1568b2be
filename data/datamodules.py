"""LightningDataModules: unsupervised text lines and NLI-style triplets. Batches are lists of raw strings; the
LightningModule templates and tokenizes them (so data stays model-agnostic)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytorch_lightning as pl
from torch.utils.data import DataLoader

from common.errors import ConfigError, DataError
from data.corpora import (
    HELD_OUT_TASKS,
    held_out_sentences,
    normalise_for_matching,
    read_nli_csv,
    read_text_lines,
    sick_triplets,
)
from data.download import DEFAULT_CACHE, fetch, load_source
from data.root import resolve_data_root

log = logging.getLogger(__name__)


def _keep_batch(batch):
    return batch


class _StringDataModule(pl.LightningDataModule):
    """Shared: global batch size split over ranks, held-out filtering, shuffled drop-last loader."""

    def __init__(self, batch_size: int, data_root: str | None = None,
                 held_out_tasks: list[str] | tuple[str, ...] = HELD_OUT_TASKS, max_examples: int | None = None,
                 num_workers: int = 0, download: str | None = None, cache_dir: str | None = None):
        super().__init__()
        self.batch_size = batch_size
        self.data_root = data_root
        self.held_out_tasks = tuple(held_out_tasks or ())
        self.max_examples = max_examples
        self.num_workers = num_workers
        self.download = download
        self.cache_dir = Path(cache_dir) if cache_dir else DEFAULT_CACHE
        self.examples: list = []
        self.dropped_held_out = 0

    @property
    def per_device_batch_size(self) -> int:
        world = self.trainer.world_size if self.trainer is not None else 1
        if self.batch_size % world:
            raise ConfigError(f"global batch size {self.batch_size} is not divisible by the world size {world}; "
                              f"use a multiple of {world}")
        return self.batch_size // world

    def resolve(self, name: str) -> Path:
        """A corpus path. One rule: an absolute path is used as given; a relative path is relative to the data root,
        never to the current directory (a same-named file there must not silently replace the configured corpus);
        when `download` names a source, the relative name is that source's file, fetched (cached)."""
        path = Path(name).expanduser()
        if path.is_absolute():
            return path
        if self.download:
            source = load_source(self.download)
            return fetch(source["url"], self.cache_dir, source.get("sha256"))
        return resolve_data_root(self.data_root) / path

    def load(self) -> list:
        raise NotImplementedError

    def sentences_of(self, example) -> tuple[str, ...]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.examples:
            return
        examples = self.load()
        if self.held_out_tasks:
            held = held_out_sentences(resolve_data_root(self.data_root), self.held_out_tasks)
            kept = [e for e in examples if not any(normalise_for_matching(s) in held for s in self.sentences_of(e))]
            self.dropped_held_out = len(examples) - len(kept)
            examples = kept
        if self.max_examples:
            examples = examples[: self.max_examples]
        if len(examples) < self.batch_size:
            raise DataError(f"corpus has {len(examples)} examples after filtering, fewer than one batch "
                            f"({self.batch_size}); add data or lower data.batch_size")
        log.info("training corpus: %d examples (%d dropped: held-out evaluation sentences)", len(examples),
                 self.dropped_held_out)
        self.examples = examples

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.examples, batch_size=self.per_device_batch_size, shuffle=True, drop_last=True,
                          num_workers=self.num_workers, collate_fn=_keep_batch)


class TextLinesDataModule(_StringDataModule):
    """Unsupervised sentences, one per line, from local files (relative to the data root) or a download source
    (`download: wiki1m` fetches SimCSE's wiki1m_for_simcse.txt, cached)."""

    def __init__(self, files: list[str], batch_size: int = 64, **kwargs):
        super().__init__(batch_size, **kwargs)
        self.files = list(files)

    def load(self) -> list[str]:
        return read_text_lines([self.resolve(name) for name in self.files])

    def sentences_of(self, example: str) -> tuple[str, ...]:
        return (example,)


class TripletDataModule(_StringDataModule):
    """(sentence, entailment, contradiction) triplets: `format: nli_csv` (SimCSE's nli_for_simcse.csv, local or
    `download: nli`) or `format: sick` (triplets built from SICK train, for CPU-scale runs)."""

    def __init__(self, file: str, format: str = "nli_csv", batch_size: int = 64, **kwargs):
        super().__init__(batch_size, **kwargs)
        if format not in ("nli_csv", "sick"):
            raise ConfigError(f"unknown triplet format {format!r}; valid: nli_csv, sick")
        self.file = file
        self.format = format

    def load(self) -> list[tuple[str, str, str]]:
        path = self.resolve(self.file)
        return read_nli_csv(path) if self.format == "nli_csv" else sick_triplets(path)

    def sentences_of(self, example) -> tuple[str, ...]:
        return example
