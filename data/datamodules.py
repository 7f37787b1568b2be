"""LightningDataModules: unsupervised text lines and NLI-style triplets.

The corpus files are read once, in one streaming pass, into a memory-mapped Arrow table (`data/corpus_tables.py`:
held-out sentences dropped, `max_examples` kept, cached by the files' bytes), so no corpus is ever held in memory
whole. With `pretokenize` (the default) that table is tokenized once into another (`data/pretokenized.py`, cached
across runs) by the tokenizer and sentence rule of the module being trained, and batches are padded sentence ids
({"ids", "lengths"}) the module wraps in its templates on the device. Without it, or without a module that offers
a tokenization, batches are lists of raw strings (read from the corpus table) the module templates and tokenizes
itself.

The order of the examples is a pure function of (seed, epoch) (`promptemb.data.sampling.EpochSampler`), and the position
inside the epoch travels in every checkpoint (`state_dict`), so a resumed run trains on exactly the batches the
uninterrupted run would have, with or without workers and under DDP.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from promptemb.common.bounds import AtLeastOne, NonNegativeInt, Seed
from promptemb.common.device_profile import profile_of
from promptemb.common.errors import ConfigError, DataError
from promptemb.data.corpus_tables import CorpusRows, CorpusSource, CorpusTable, TooFewExamplesError, corpus_table
from promptemb.data.download import DEFAULT_CACHE, fetch, load_source
from promptemb.data.mined_triplets import mined_provenance
from promptemb.data.pretokenized import (
    PretokenizedExamples,
    SentenceTokenization,
    pad_sentence_ids,
    pretokenized_corpus,
)
from promptemb.data.root import resolve_data_root
from promptemb.data.sampling import DataPosition, EpochSampler
from promptemb.data.training_corpora import HELD_OUT_TASKS, check_nli_header, held_out_sentences

log = logging.getLogger(__name__)
# Lightning cannot see that the datamodule restores the position itself (its own check wants a stateful loader).
warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")


def _keep_batch(batch):
    return batch


def local_corpus_path(name: str, data_root: str | None) -> Path:
    """The one path rule of a local corpus: an absolute path as given, a relative one under the data root (never the
    current directory: a same-named file there must not silently replace the configured corpus)."""
    path = Path(name).expanduser()
    return path if path.is_absolute() else resolve_data_root(data_root) / path


class _StringDataModule(pl.LightningDataModule):
    """Shared: global batch size split over ranks, held-out filtering, shuffled drop-last loader."""

    def __init__(self, batch_size: AtLeastOne, data_root: str | None = None,
                 held_out_tasks: list[str] | tuple[str, ...] = HELD_OUT_TASKS, max_examples: AtLeastOne | None = None,
                 num_workers: NonNegativeInt | Literal["auto"] = "auto", download: str | None = None,
                 cache_dir: str | None = None, seed: Seed = 0, pretokenize: bool = True,
                 tokenize_processes: AtLeastOne | None = None, pin_memory: bool | Literal["auto"] = "auto",
                 group_by_length: bool = False, distinct_in_batch: bool = False, verify_cache: bool = False):
        """`num_workers`/`pin_memory` `auto`: 4 workers (persistent) and pinned memory when the trainer runs on an
        accelerator, 0 and off on a CPU. `tokenize_processes`: processes for pre-tokenizing a large corpus (default:
        every core, in the one process per node that prepares the data). `group_by_length`, `distinct_in_batch`: see
        `promptemb.data.sampling`. `verify_cache`: hash the pre-tokenized cache in full when opening it, however
        large (smaller ones always are)."""
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
        self.corpus: CorpusTable | None = None  # the examples as trained on, memory-mapped
        self.examples: CorpusRows | None = None  # ... as the loader reads raw examples (str or tuple of str)
        self.dropped_held_out = 0
        self.truncated_sentences = 0  # counted on the pre-tokenized path
        self.pretokenize = pretokenize
        self.tokenize_processes = tokenize_processes
        self.pin_memory = pin_memory
        self.group_by_length = group_by_length
        self.distinct_in_batch = distinct_in_batch
        self.verify_cache = verify_cache
        self.tokenization: SentenceTokenization | None = None
        self.dataset = None  # what the loader reads: the examples, or their pre-tokenized table
        self.collate = _keep_batch

    def use_tokenization(self, tokenization: SentenceTokenization | None) -> None:
        """Pre-tokenize with this (without a trainer; under a trainer, setup asks its module)."""
        self.tokenization = tokenization
        self.dataset = None

    @property
    def per_device_batch_size(self) -> int:
        world = self.trainer.world_size if self.trainer is not None else 1
        if self.batch_size % world:
            raise ConfigError(f"global batch size {self.batch_size} is not divisible by the world size {world}; "
                              f"use a multiple of {world}")
        return self.batch_size // world

    def resolve(self, name: str) -> Path:
        """A corpus path (`local_corpus_path`); when `download` names a source, a relative name is that source's
        file, fetched (cached)."""
        path = Path(name).expanduser()
        if self.download and not path.is_absolute():
            return fetch(load_source(self.download), self.cache_dir)
        return local_corpus_path(name, self.data_root)

    #: The config keys naming corpus files (a list or one name), checked by `check_files`.
    file_keys: tuple[str, ...] = ()

    def corpus_names(self) -> list[str]:
        """The corpus files as configured (names before `resolve`, in order): what `file_keys` hold."""
        values = [getattr(self, key) for key in self.file_keys]
        return [name for value in values for name in ([value] if isinstance(value, str) else value)]

    @classmethod
    def check_files(cls, settings: dict) -> None:
        """A config node's local corpus files exist and are readable as this module reads them, checked without
        building the module (train.py's config check); with a `download` source (fetched when the run starts) a
        relative name must be that source's file, which it stands for."""
        named = [(key, name) for key in cls.file_keys
                 for name in ([settings[key]] if isinstance(settings.get(key), str) else settings.get(key) or ())]
        if settings.get("download"):
            fetched = load_source(settings["download"])["filename"]
            relative = [name for _, name in named if not Path(name).expanduser().is_absolute()]
            if len(relative) > 1 or any(Path(name).as_posix() != fetched for name in relative):
                key = named[0][0]
                raise ConfigError(f"data.{key}={relative} but data.download={settings['download']} fetches "
                                  f"{fetched}, which a relative name stands for: set data.download=null to train on "
                                  f"your own files (relative to the data root), or data.{key} to the one name "
                                  f"{fetched}")
            return
        for key, name in named:
            path = local_corpus_path(name, settings.get("data_root"))
            if not path.is_file():
                raise ConfigError(f"data.{key}: corpus file {path} does not exist (relative paths are relative to "
                                  f"the data root {resolve_data_root(settings.get('data_root'))})")
            cls.check_file(path, settings)

    @classmethod
    def check_file(cls, path: Path, settings: dict) -> None:
        """What a subclass verifies in an existing corpus file before training (nothing by default)."""

    def corpus_format(self) -> str:
        """How the files are read (`corpus_tables.CorpusSource.format`)."""
        raise NotImplementedError

    def corpus_paths(self) -> list[Path]:
        """The corpus files, in order (fetched first when `download` names a source)."""
        raise NotImplementedError

    def corpus_source(self) -> CorpusSource:
        """The files, their format and what is dropped and kept, with the held-out sentences read."""
        held = held_out_sentences(resolve_data_root(self.data_root), self.held_out_tasks) if self.held_out_tasks \
            else None
        return CorpusSource(self.corpus_format(), tuple(self.corpus_paths()), held, self.max_examples)

    def iter_examples(self):
        """Every example of the corpus files, before held-out filtering, streamed."""
        return CorpusSource(self.corpus_format(), tuple(self.corpus_paths())).examples()

    def prepare_data(self) -> None:
        """Lightning runs this in one process per node (local rank 0) while the other ranks wait at a barrier: the
        download, the corpus read and the pre-tokenizing pass happen once, with every core, and each rank's `setup`
        then opens the cached tables."""
        self.setup("fit", processes=self.tokenize_processes or os.cpu_count())

    def setup(self, stage: str | None = None, processes: int | None = None) -> None:
        if self.corpus is None:
            self.corpus = self._open_corpus()
            self.examples = CorpusRows(self.corpus)
        if self.dataset is None:
            self._prepare_dataset(processes or self._tokenize_processes_per_rank())

    def _tokenize_processes_per_rank(self) -> int:
        """Should a rank have to pre-tokenize itself (no shared cache), the node's cores divided among its ranks."""
        if self.tokenize_processes:
            return self.tokenize_processes
        ranks_on_node = self.trainer.num_devices if self.trainer is not None else 1
        return max(1, (os.cpu_count() or 1) // max(1, ranks_on_node))

    def _open_corpus(self) -> CorpusTable:
        source = self.corpus_source()
        try:
            corpus = corpus_table(source, self.cache_dir, minimum_examples=self.batch_size, verify=self.verify_cache)
        except TooFewExamplesError as err:
            raise DataError(self._too_few_examples(err.counts, source)) from None
        self.dropped_held_out = corpus.counts["dropped_held_out"]
        log.info("training corpus: %d examples (%d dropped: held-out evaluation sentences%s)", len(corpus),
                 self.dropped_held_out, _per_task(corpus.counts) and f" of {_per_task(corpus.counts)}")
        return corpus

    def _too_few_examples(self, counts: dict, source: CorpusSource) -> str:
        """Fewer examples than one batch: how many the files gave and the held-out filter dropped (and why), and
        the cures that fit."""
        kept, read, dropped = counts["examples"], counts["read"], counts["dropped_held_out"]
        message = f"corpus has {kept:,} examples after filtering, fewer than one batch ({self.batch_size})"
        unfiltered = min(read, self.max_examples or read)  # what the files give without the held-out filter
        cures = []
        if dropped:
            files = ", ".join(str(path) for path in source.paths)
            amount = f"all {dropped:,}" if dropped == read else f"{dropped:,} of the {read:,}"
            message += (f": the held-out filter dropped {amount} examples read from {files}, as they contain "
                        f"sentences of evaluated tasks ({_per_task(counts)}), which training must never see")
            if not kept or unfiltered >= self.batch_size:  # the filter, not the corpus size, is what stops the run
                cures.append(self._held_out_cure(counts))
        if unfiltered < self.batch_size:
            cures.append("add data or lower data.batch_size" + (f" (the files give {unfiltered:,} examples)"
                                                                 if dropped else ""))
        return f"{message}; {'; '.join(cures)}"

    def _held_out_cure(self, counts: dict) -> str:
        if tuple(self.held_out_tasks) != HELD_OUT_TASKS:  # the user's own list
            matched = ", ".join(sorted(counts.get("dropped_by_task") or {}))
            return (f"to train on this text, remove the tasks it shares sentences with ({matched}) from "
                    "data.held_out_tasks and report their scores as contaminated")
        if self.corpus_format() == "sick":
            return ("to train on SICK, use data=sick_triplets (it holds out the STS tasks only; the SICK-R score is "
                    "then reported as contaminated)")
        return ("train on text of no evaluated task, or hold out only the tasks you will evaluate: "
                "+data.held_out_tasks=[TASK,...] (task names or groups: sts, transfer, clustering)")

    def _prepare_dataset(self, processes: int) -> None:
        self.dataset, self.collate = self.examples, _keep_batch
        module = self.trainer.lightning_module if self.trainer is not None else None
        if self.tokenization is None and hasattr(module, "sentence_tokenization"):
            self.tokenization = module.sentence_tokenization()
        if self.pretokenize and self.tokenization is not None:
            table = pretokenized_corpus(self.corpus, self.tokenization, self.cache_dir, processes,
                                        verify=self.verify_cache)
            self.dataset, self.collate = PretokenizedExamples(table), pad_sentence_ids
            self.truncated_sentences = self.dataset.count_longer_than(self.tokenization.keep - 1)
            if self.truncated_sentences:
                log.info("training corpus: %s of %s sentences longer than %d tokens are truncated to that length "
                         "(the recipe's max_sentence_tokens)", f"{self.truncated_sentences:,}",
                         f"{len(self.dataset) * len(self.dataset.columns):,}", self.tokenization.keep - 1)

    def example_lengths(self):
        """Length of each example for length grouping (an array): its stored token count when pre-tokenized, else
        characters."""
        if isinstance(self.dataset, PretokenizedExamples):
            return self.dataset.example_lengths()
        return self.examples.lengths()

    def duplicate_keys(self):
        """Equal for examples whose first sentence (the anchor) is the same text (an array)."""
        return self.examples.first_sentence_ids()

    def _loader_settings(self) -> tuple[int, bool]:
        """(workers, pinned memory): the trainer's device profile resolves `auto` (common/device_profile.py)."""
        if self.trainer is None:
            return (0 if self.num_workers == "auto" else self.num_workers,
                    self.pin_memory is True and torch.cuda.is_available())
        profile = profile_of(self.trainer)
        return profile.loader_workers(self.num_workers), profile.pin_memory(self.pin_memory)

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        if self.dataset is None:
            self.setup("fit")
        position = self.resume_at
        options = {"lengths": self.example_lengths() if self.group_by_length else None,
                   "keys": self.duplicate_keys() if self.distinct_in_batch else None}
        sampler = EpochSampler(len(self.examples), self.per_device_batch_size, self.seed,
                               rank=trainer.global_rank if trainer else 0, world_size=trainer.world_size if trainer
                               else 1, resume_at=position, **options)
        if position.batches_done >= sampler.batches_per_epoch:  # saved after an epoch's last batch
            sampler = EpochSampler(sampler.num_examples, sampler.per_device_batch_size, self.seed, sampler.rank,
                                   sampler.world_size, DataPosition(position.epoch + 1, 0), **options)
        workers, pin = self._loader_settings()
        # its own generator: creating the loader's iterator must not draw from the global RNG (dropout's)
        return DataLoader(self.dataset, batch_size=self.per_device_batch_size, sampler=sampler, drop_last=True,
                          num_workers=workers, collate_fn=self.collate, pin_memory=pin,
                          persistent_workers=workers > 0, generator=torch.Generator().manual_seed(self.seed))

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

    file_keys = ("files",)

    def __init__(self, files: list[str], batch_size: AtLeastOne = 64, **kwargs):
        super().__init__(batch_size, **kwargs)
        self.files = list(files)

    def corpus_format(self) -> str:
        return "lines"

    def corpus_paths(self) -> list[Path]:
        return [self.resolve(name) for name in self.files]


class TripletDataModule(_StringDataModule):
    """(sentence, entailment, contradiction) triplets: `format: nli_csv` (SimCSE's nli_for_simcse.csv, local or
    `download: nli`, or a file of mined hard negatives, `python -m promptemb.research.mine_hard_negatives`, whose
    provenance is checked against it) or `format: sick` (triplets built from SICK train, for CPU-scale runs)."""

    file_keys = ("file",)

    @classmethod
    def check_file(cls, path: Path, settings: dict) -> None:
        if settings.get("format", "nli_csv") == "nli_csv":
            check_nli_header(path)
            mined_provenance(path)  # a mined file must still be the one its provenance describes

    def __init__(self, file: str, format: Literal["nli_csv", "sick"] = "nli_csv", batch_size: AtLeastOne = 64,
                 **kwargs):
        super().__init__(batch_size, **kwargs)
        if format not in ("nli_csv", "sick"):
            raise ConfigError(f"unknown triplet format {format!r}; valid: nli_csv, sick")
        self.file = file
        self.format = format
        self.mined: dict | None = None  # the provenance of a mined hard-negative file, as checked when read

    def corpus_format(self) -> str:
        return self.format

    def _open_corpus(self) -> CorpusTable:
        if self.format == "nli_csv":  # a mined file must still be the one its provenance describes
            self.mined = mined_provenance(self.resolve(self.file))
        return super()._open_corpus()

    def corpus_paths(self) -> list[Path]:
        return [self.resolve(self.file)]


def _per_task(counts: dict) -> str:
    """`SICK-E: 494, SICKRelatedness: 410`: examples dropped per held-out task, most first (an example sharing
    sentences with several tasks counts for each)."""
    by_task = sorted((counts.get("dropped_by_task") or {}).items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{task}: {n:,}" for task, n in by_task)
