"""LightningDataModules: unsupervised text lines and NLI-style triplets. Batches are lists of raw strings; the
LightningModule templates and tokenizes them (so data stays model-agnostic).

The order of the examples is a pure function of (seed, epoch) (`data.sampling.EpochSampler`), and the position
inside the epoch travels in every checkpoint (`state_dict`), so a resumed run trains on exactly the batches the
uninterrupted run would have, with or without workers and under DDP.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch
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
from data.sampling import DataPosition, EpochSampler

log = logging.getLogger(__name__)
# Lightning cannot see that the datamodule restores the position itself (its own check wants a stateful loader).
warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")


def _keep_batch(batch):
    return batch


class _StringDataModule(pl.LightningDataModule):
    """Shared: global batch size split over ranks, held-out filtering, shuffled drop-last loader."""

    def __init__(self, batch_size: int, data_root: str | None = None,
                 held_out_tasks: list[str] | tuple[str, ...] = HELD_OUT_TASKS, max_examples: int | None = None,
                 num_workers: int = 0, download: str | None = None, cache_dir: str | None = None, seed: int = 0):
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed
        self.resume_at = DataPosition()
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
            return fetch(load_source(self.download), self.cache_dir)
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
        trainer = self.trainer
        sampler = EpochSampler(len(self.examples), self.per_device_batch_size, self.seed,
                               rank=trainer.global_rank if trainer else 0, world_size=trainer.world_size if trainer
                               else 1, resume_at=self.resume_at)
        if self.resume_at.batches_done >= sampler.batches_per_epoch:  # saved after an epoch's last batch
            sampler = EpochSampler(sampler.num_examples, sampler.per_device_batch_size, self.seed, sampler.rank,
                                   sampler.world_size, DataPosition(self.resume_at.epoch + 1, 0))
        # its own generator: creating the loader's iterator must not draw from the global RNG (dropout's)
        return DataLoader(self.examples, batch_size=self.per_device_batch_size, sampler=sampler, drop_last=True,
                          num_workers=self.num_workers, collate_fn=_keep_batch,
                          generator=torch.Generator().manual_seed(self.seed))

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the epoch and how many of its batches have been trained on."""
        trainer = self.trainer
        if trainer is None:
            return {}
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        return {"seed": self.seed, "epoch": trainer.current_epoch, "batches_done": progress.processed,
                "num_examples": len(self.examples)}

    def load_state_dict(self, state_dict: dict) -> None:
        if not state_dict:
            return
        if state_dict["seed"] != self.seed:
            raise ConfigError(f"the checkpoint was trained with seed={state_dict['seed']}, this run has "
                              f"seed={self.seed}; resume with seed={state_dict['seed']} (the data order depends on it)")
        if state_dict["num_examples"] != len(self.examples):
            raise DataError(f"the training corpus has {len(self.examples)} examples, the checkpoint was trained on "
                            f"{state_dict['num_examples']}; resume with the same data settings")
        self.resume_at = DataPosition(int(state_dict["epoch"]), int(state_dict["batches_done"]))


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
