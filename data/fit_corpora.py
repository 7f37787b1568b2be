"""Named fit corpora for idf weights and post-processors; the label travels with every score fitted on it.

    T           the target task's own unlabeled sentences (both sides of every pair), fitted per task
    W           the reference Wikipedia sample `training/partial/wiki1m_for_simcse.first11914lines.txt`
    stsb_train  the sentences of the STS-B train split
    file:PATH   any text file, one sentence per line (relative paths are under the data root)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.readers import read_sentences
from promptemb.data.tasks import TaskSpec

TARGET = "T"
WIKI = "W"
WIKI_FILE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
STSB_TRAIN = "stsb_train"
FILE_PREFIX = "file:"
LABELS = (TARGET, WIKI, STSB_TRAIN, f"{FILE_PREFIX}PATH")


class Corpora:
    """Resolves corpus labels other than "T" to sentences (read once), and records where each came from."""

    def __init__(self, root: Path, registry: dict[str, TaskSpec]):
        self.root, self.registry = root, registry
        self._cache: dict[str, list[str]] = {}
        self.sources: dict[str, dict] = {}

    @staticmethod
    def check_label(label: str) -> None:
        if label in (TARGET, WIKI, STSB_TRAIN) or (label.startswith(FILE_PREFIX) and len(label) > len(FILE_PREFIX)):
            return
        raise ConfigError(f"unknown fit corpus {label!r}; valid: {', '.join(LABELS)}")

    def sentences(self, label: str) -> list[str]:
        self.check_label(label)
        if label == TARGET:
            raise ConfigError("fit corpus 'T' is the target task's own sentences; it has no single sentence list")
        if label not in self._cache:
            self._cache[label] = self._load(label)
        return self._cache[label]

    def _load(self, label: str) -> list[str]:
        if label == STSB_TRAIN:
            if "STSBenchmark-train" not in self.registry:
                raise ConfigError("fit corpus 'stsb_train' needs task STSBenchmark-train in the task registry")
            spec = self.registry["STSBenchmark-train"]
            pairs = spec.load(self.root)
            self.sources[label] = {"task": spec.name, "files": spec.files()}
            return list(dict.fromkeys(pairs.sentences1 + pairs.sentences2))
        relative = WIKI_FILE if label == WIKI else label[len(FILE_PREFIX) :]
        path = Path(relative) if Path(relative).is_absolute() else self.root / relative
        if not path.is_file():
            raise DataError(f"fit corpus {label!r}: file {path} does not exist; fetch the data or pass another "
                            f"fit_corpus ({', '.join(LABELS)})")
        sentences = [" ".join(line.split()) for line in read_sentences(path)]
        self.sources[label] = {"file": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        return sentences
