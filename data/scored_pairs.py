"""Sentence pairs with a gold similarity score for training (AnglE / CoSENT): STS-B train (`format: stsb`) and SICK-R
train (`format: sick_relatedness`), through the same corpus table, held-out filter, sampler and pre-tokenized cache as
every other training corpus (`datamodules.py`). The scores travel beside the sentences: a batch is
{"ids": [B, 2, L], "lengths": [B, 2], "scores": [B]} pre-tokenized, or {"pairs": [(s1, s2), ...], "scores": [B]}.

The scores are the file's own (STS-B 0-5, SICK-R 1-5), unrescaled: CoSENT and the angle term read only their order,
and AnglE's in-batch term reads them truncated to integers, as the official code does. `score_range` declares the
range a file must keep to; a score outside it stops train.py's config check in one line, before any model loads.
Several files make one corpus (`file` and `format` lists, one format per file: STS-B and SICK-R train together, as
Pcc-tuning trains), each read with its own layout and scale.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from promptemb.common.bounds import AtLeastOne
from promptemb.common.errors import ConfigError, DataError
from promptemb.data.corpus_tables import CorpusSource
from promptemb.data.datamodules import _StringDataModule, local_corpus_path
from promptemb.data.pretokenized import pad_sentence_ids
from promptemb.data.training_corpora import SCORED_PAIR_READERS, scored_pairs

ScoredFormat = Literal["stsb", "sick_relatedness"]
#: each format's declared range of gold scores (the datasets' own annotation scales)
SCORE_RANGES = {"stsb": (0.0, 5.0), "sick_relatedness": (1.0, 5.0)}


def check_score_range(score_range, key: str = "data.score_range") -> tuple[float, float]:
    """[low, high] with finite low < high, as a tuple; anything else one line."""
    values = list(score_range) if isinstance(score_range, list | tuple) else None
    if (values is None or len(values) != 2 or any(isinstance(v, bool) or not isinstance(v, int | float)
                                                  or not math.isfinite(v) for v in values) or values[0] >= values[1]):
        raise ConfigError(f"{key}={score_range!r}: give [low, high], two finite numbers with low < high")
    return float(values[0]), float(values[1])


def file_formats(file, format) -> list[tuple[str, str]]:
    """(name, format) of every file of a scored-pair corpus: `file` one name or a list, `format` one format for all or
    one per file. One line for an unknown format or a count that does not fit."""
    files = [file] if isinstance(file, str) else list(file or [])
    formats = [format] * len(files) if isinstance(format, str) else list(format or [])
    if not files or len(formats) != len(files):
        raise ConfigError(f"data.format={format} for data.file={file}: give one format for every file, or one for all")
    for fmt in formats:
        if fmt not in SCORE_RANGES:
            raise ConfigError(f"data.format={fmt!r}: scored pairs are read as {' or '.join(SCORE_RANGES)}")
    return list(zip(files, formats, strict=True))


def default_range(formats: list[str]) -> tuple[float, float]:
    """The range every format's declared scale fits in."""
    return min(SCORE_RANGES[f][0] for f in formats), max(SCORE_RANGES[f][1] for f in formats)


def scores_of(path: Path, format: str) -> list[float]:
    """The gold score of every pair of a scored-pair file."""
    return [score for _, _, score in scored_pairs(path, format)]


def scores_outside(path: Path, format: str, score_range: tuple[float, float]) -> str | None:
    """The first pair of the file whose score leaves `score_range`, as `file:line: score S`, or None."""
    low, high = score_range
    _, first_line = SCORED_PAIR_READERS[format]
    for number, (_, _, score) in enumerate(scored_pairs(path, format), start=first_line):
        if not low <= score <= high:
            return f"{path}:{number}: score {score:g}"
    return None


class ScoredRows(torch.utils.data.Dataset):
    """The loader's rows: (the pair as the inner rows give it, its score)."""

    def __init__(self, rows, scores: np.ndarray):
        self.rows, self.scores = rows, scores

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list:
        return list(zip(self.rows.__getitems__(list(indices)), self.scores[list(indices)].tolist(), strict=True))


def collate_pretokenized(examples: list) -> dict[str, torch.Tensor]:
    batch = pad_sentence_ids([pair for pair, _ in examples])
    return {**batch, "scores": torch.tensor([score for _, score in examples], dtype=torch.float32)}


def collate_raw(examples: list) -> dict:
    return {"pairs": [pair for pair, _ in examples],
            "scores": torch.tensor([score for _, score in examples], dtype=torch.float32)}


class ScoredPairDataModule(_StringDataModule):
    """(sentence 1, sentence 2, gold score) pairs from one file or several (relative to the data root): `format: stsb`
    (STS-B's csv layout) or `sick_relatedness` (SICK's), one for all files or a list, one per file; `score_range`
    (default: the range of the formats' own scales) bounds the scores."""

    file_keys = ("file",)

    @classmethod
    def check_file(cls, path: Path, settings: dict) -> None:
        pairs = file_formats(settings.get("file"), settings.get("format", "stsb"))
        format = next(fmt for name, fmt in pairs if local_corpus_path(name, settings.get("data_root")) == path)
        score_range = check_score_range(settings.get("score_range") or default_range([f for _, f in pairs]))
        if bad := scores_outside(path, format, score_range):
            raise DataError(f"{bad} is outside data.score_range [{score_range[0]:g}, {score_range[1]:g}]; fix the "
                            "file or declare the range its scores use")

    def __init__(self, file: str | list[str], format: ScoredFormat | list[ScoredFormat] = "stsb",
                 score_range: list[float] | None = None, batch_size: AtLeastOne = 32, **kwargs):
        super().__init__(batch_size, **kwargs)
        self.formats = [fmt for _, fmt in file_formats(file, format)]
        self.file = file
        self.format = format
        self.score_range = check_score_range(score_range or default_range(self.formats))

    def corpus_format(self) -> str:
        return self.formats[0]

    def corpus_paths(self) -> list[Path]:
        return [self.resolve(name) for name in self.corpus_names()]

    def corpus_source(self) -> CorpusSource:
        source = super().corpus_source()
        return replace(source, formats=tuple(self.formats)) if len(set(self.formats)) > 1 else source

    def iter_examples(self):
        return replace(self.corpus_source(), held_out=None, max_examples=None).examples()

    def _prepare_dataset(self, processes: int) -> None:
        super()._prepare_dataset(processes)
        scores = self.corpus.scores()
        low, high = self.score_range
        if scores is None or not ((scores >= low) & (scores <= high)).all():  # the file changed after the check
            raise DataError(f"{self.file}: scores outside data.score_range [{low:g}, {high:g}]")
        pretokenized = self.collate is pad_sentence_ids
        self.dataset = ScoredRows(self.dataset, scores)
        self.collate = collate_pretokenized if pretokenized else collate_raw

    def example_lengths(self):
        inner = self.dataset.rows if isinstance(self.dataset, ScoredRows) else self.dataset
        if hasattr(inner, "example_lengths"):
            return inner.example_lengths()
        return self.examples.lengths()
