"""MTEB's own STS tasks on the local SentEval files, so `mteb.evaluate` runs with no network:

    mteb.evaluate(MTEBEncoder(load_encoder(DIR)), local_tasks(["STS12", "STSBenchmark"]))

Each task is a subclass of MTEB's class of that name (its metadata, split, evaluator and main score: cosine
Spearman over the whole split) whose `load_data` reads the task registry's files (tasks.yaml: its readers and sha256
checks) instead of the hub copy. The dataset revision is the files' sha256: the file's own for one file; for several,
the sha256 of their `sha256sum` lines (`HASH  PATH`, paths relative to the data root, sorted by path).

MTEB's SICK-R is all 9,927 SICK pairs (train + trial + test), so the local one reads the three files; it is not the
4,927-pair test split evaluate.py's SICKRelatedness scores. STS12-16 are the registry's tasks as they are (every
subset of a year, blank gold lines dropped). MTEB's `only-missing` cache does not compare dataset revisions of a
complete result: keep results of these tasks apart from those of MTEB's hub copies (another `cache=`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from promptemb.common.errors import ConfigError
from promptemb.common.optional import require
from promptemb.data.checksums import verify_file
from promptemb.data.readers import SentencePairs
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import load_registry

#: MTEB task name -> (its class in `mteb.tasks`, the registry tasks whose pairs make up its test split)
LOCAL_TASKS = {
    "STS12": ("STS12STS", ("STS12",)),
    "STS13": ("STS13STS", ("STS13",)),
    "STS14": ("STS14STS", ("STS14",)),
    "STS15": ("STS15STS", ("STS15",)),
    "STS16": ("STS16STS", ("STS16",)),
    "STSBenchmark": ("STSBenchmarkSTS", ("STSBenchmark",)),
    "SICK-R": ("SickrSTS", ("SICKRelatedness-train", "SICKRelatedness-trial", "SICKRelatedness")),
}


def registry_files(name: str) -> dict[str, str]:
    """Every file the local MTEB task `name` reads: path relative to the data root -> sha256 (from the registry)."""
    registry = load_registry()
    return {path: sha for part in LOCAL_TASKS[name][1] for path, sha in registry[part].files().items()}


def dataset_revision(files: dict[str, str]) -> str:
    """One file: its sha256; several: the sha256 of their `sha256sum` lines, sorted by path."""
    if len(files) == 1:
        return next(iter(files.values()))
    return hashlib.sha256("".join(f"{sha}  {path}\n" for path, sha in sorted(files.items())).encode()).hexdigest()


class LocalSTS:
    """What every local task adds to MTEB's class: the data root, and `load_data` from the registry's files."""

    registry_tasks: tuple[str, ...] = ()

    def __init__(self, data_root: str | os.PathLike | None = None, **kwargs):
        super().__init__(**kwargs)
        self.data_root = data_root

    def load_data(self, num_proc: int | None = None, **kwargs) -> None:
        from datasets import Dataset, DatasetDict

        if self.data_loaded:
            return
        root, registry = resolve_data_root(self.data_root), load_registry()
        pairs = SentencePairs()
        for part in self.registry_tasks:
            pairs.extend(registry[part].load(root))
        self.dataset = DatasetDict({"test": Dataset.from_dict(
            {"sentence1": pairs.sentences1, "sentence2": pairs.sentences2, "score": pairs.gold})})
        self.dataset_transform(num_proc=num_proc)
        self.data_loaded = True


@cache
def local_task_class(name: str) -> type:
    """MTEB's task class `name` reading the local files, with their revision (one class per name)."""
    class_name, parts = LOCAL_TASKS[name]
    base = getattr(require("mteb", "MTEB's tasks").tasks, class_name)
    files = registry_files(name)
    dataset = {"path": os.path.commonpath(list(files)), "revision": dataset_revision(files)}
    return type(f"Local{base.__name__}", (LocalSTS, base), {
        "metadata": base.metadata.model_copy(update={"dataset": dataset}), "registry_tasks": parts,
        "__module__": __name__, "__doc__": f"MTEB's {name} on the local files {', '.join(sorted(files))}."})


def local_tasks(names: Sequence[str], data_root: str | os.PathLike | None = None) -> list:
    """The local MTEB tasks `names` on the data under `data_root` (default `$PROMPTEMB_DATA`), every file checked
    against its sha256 now, before any model runs; a name without local data is one line."""
    unknown = [name for name in names if name not in LOCAL_TASKS]
    if unknown or not names:
        given = f"MTEB task {unknown[0]!r} has no local data" if unknown else "no MTEB task given"
        raise ConfigError(f"{given}; local MTEB tasks: {', '.join(LOCAL_TASKS)} (any other task loads from the "
                          "Hugging Face Hub: mteb.get_tasks([...]))")
    root = resolve_data_root(data_root)
    for name in names:
        for path, sha in registry_files(name).items():
            verify_file(Path(root), path, sha)
    return [local_task_class(name)(data_root=root) for name in names]
