"""The task registry: `tasks.yaml` holds one record per task (STS, SentEval transfer, short-text clustering) and the
named groups of tasks (`sts`, `transfer`, `clustering`; `all` = every group); this module loads them, reads a task's
files by its `format`, and resolves task names and groups. A task's `family` names the evaluation family that scores
it (evaluation/families.py); which families exist is the evaluation layer's business, not this module's."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.checksums import verify_file
from promptemb.data.labeled_readers import (
    LabeledSplit,
    read_binary,
    read_clustering,
    read_mrpc,
    read_sick_entailment,
    read_sst,
    read_trec,
)
from promptemb.data.readers import SentencePairs, read_sick, read_sts_subset, read_stsb

REGISTRY_FILE = Path(__file__).with_name("tasks.yaml")
#: The group that is every other group's tasks, in order (unless a registry file names its own).
ALL = "all"
#: Formats read into scored sentence pairs (`TaskSpec.load`).
PAIR_FORMATS = ("sts_year", "stsb", "sick")
#: Formats with one file per split read into labelled examples (`TaskSpec.load_labeled`).
SPLIT_READERS = {
    "sst_binary": lambda path, encoding: read_sst(path, encoding, fine=False),
    "sst_fine": lambda path, encoding: read_sst(path, encoding, fine=True),
    "trec": read_trec,
    "mrpc": read_mrpc,
    "sick_entailment": read_sick_entailment,
}


@dataclass(frozen=True)
class TaskSpec:
    name: str
    format: str  # sts_year | stsb | sick | binary | sst_binary | sst_fine | trec | mrpc | sick_entailment | clustering
    #   (or any format of a user's family, which reads its own files)
    split: str
    pairs: int  # STS: scored pairs; transfer: examples of the scored split (all of them under CV); clustering: rows
    main_score: str
    record: dict[str, Any]
    family: str = "sts"  # the evaluation family that scores it (evaluation/families.py)

    def files(self) -> dict[str, str]:
        """Every file the task reads, relative path -> expected sha256."""
        if self.format == "sts_year":
            return {
                entry[role]["path"]: entry[role]["sha256"]
                for entry in self.record["subsets"]
                for role in ("input", "gold")
            }
        if self.format == "binary":
            return {self.record[role]["path"]: self.record[role]["sha256"] for role in ("positive", "negative")}
        if "splits" in self.record:
            return {entry["path"]: entry["sha256"] for entry in self.record["splits"].values()}
        return {self.record["file"]["path"]: self.record["file"]["sha256"]}

    @property
    def max_sentence_tokens(self) -> int | None:
        """The task's own sentence truncation (clustering follows its reference's 64-token inputs), if any."""
        return self.record.get("max_sentence_tokens")

    def load_labeled(self, root: Path) -> dict[str, LabeledSplit]:
        """A transfer or clustering task: split name -> labelled examples ("all" for cross-validated and clustering
        tasks), every file's sha256 verified and every split's size checked."""
        paths = {relative: verify_file(root, relative, sha) for relative, sha in self.files().items()}
        encoding = self.record.get("encoding", "utf-8")
        if self.format == "binary":
            splits = {"all": read_binary(paths[self.record["positive"]["path"]],
                                         paths[self.record["negative"]["path"]], encoding)}
            expected = {"all": self.pairs}
        elif self.format == "clustering":
            split, _names = read_clustering(paths[self.record["file"]["path"]])
            splits, expected = {"all": split}, {"all": self.pairs}
            classes = len(np.unique(split.labels))
            if classes != int(self.record["classes"]):
                raise DataError(f"task {self.name}: read {classes} labels, expected {self.record['classes']}")
        elif self.format in SPLIT_READERS:
            splits, expected = {}, {}
            for split_name, entry in self.record["splits"].items():
                splits[split_name] = SPLIT_READERS[self.format](paths[entry["path"]], encoding)
                expected[split_name] = int(entry["size"])
        else:
            raise DataError(f"task {self.name}: format {self.format!r} has no labelled examples")
        for split_name, split in splits.items():
            if len(split) != expected[split_name]:
                raise DataError(f"task {self.name}: read {len(split)} examples in split {split_name!r}, "
                                f"expected {expected[split_name]}")
        return splits

    def load(self, root: Path) -> SentencePairs:
        """Verify every file's sha256, read the pairs and check the scored-pair count."""
        if self.format not in PAIR_FORMATS:
            raise DataError(f"task {self.name}: format {self.format!r} has no scored pairs "
                            f"(formats with pairs: {', '.join(PAIR_FORMATS)})")
        paths = {relative: verify_file(root, relative, sha) for relative, sha in self.files().items()}
        if self.format == "sts_year":
            pairs = SentencePairs()
            for entry in self.record["subsets"]:
                pairs.extend(
                    read_sts_subset(paths[entry["input"]["path"]], paths[entry["gold"]["path"]], entry["name"])
                )
        elif self.format == "stsb":
            pairs = read_stsb(paths[self.record["file"]["path"]], self.split)
        else:
            pairs = read_sick(paths[self.record["file"]["path"]], self.split)
        if "subset" in self.record:
            pairs = self._subset(pairs)
        if len(pairs) != self.pairs:
            raise DataError(f"task {self.name}: read {len(pairs)} scored pairs, expected {self.pairs}")
        return pairs

    def sentences(self, root: Path) -> list[str]:
        """Every sentence of the task's files, both sides of a pair, every split (what training must never see)."""
        if self.format in PAIR_FORMATS:
            pairs = self.load(root)
            return pairs.sentences1 + pairs.sentences2
        return [sentence for split in self.load_labeled(root).values() for sentence in split.all_sentences()]

    def _subset(self, pairs: SentencePairs) -> SentencePairs:
        """A fixed subset of the file's scored pairs, in file order: `subset: {of: N, step: K, start: S, count: C}`
        keeps pairs S, S+K, S+2K, ... (at most C of them; start 0, step 1 and all of them by default) of a file whose
        scored-pair count is checked first (`of`), so the subset is the same wherever the verified file is read.
        `step` spreads the subset over a file ordered by source (STS-B test: captions, then forums, then news)."""
        subset = self.record["subset"]
        known = {"of", "step", "start", "count"}
        if not isinstance(subset, dict) or not set(subset) <= known or "of" not in subset:
            raise ConfigError(f"task {self.name}: subset must be a mapping with 'of' (the file's scored-pair count) "
                              f"and optionally 'step', 'start', 'count'; got {subset!r}")
        values = {"start": 0, "step": 1, "count": subset["of"], **subset}
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in values.values()) or not (
                values["of"] >= 1 and values["step"] >= 1 and values["count"] >= 1
                and 0 <= values["start"] < values["of"]):
            raise ConfigError(f"task {self.name}: subset needs integers of >= 1, step >= 1, count >= 1 and "
                              f"0 <= start < of; got {subset!r}")
        if len(pairs) != values["of"]:
            raise DataError(f"task {self.name}: read {len(pairs)} scored pairs, expected {values['of']} before taking "
                            f"its subset {subset!r}")
        indices = range(values["start"], values["of"], values["step"])[:values["count"]]
        return pairs.take(indices)


class TaskRegistry(dict):
    """task name -> `TaskSpec`, with the file's named groups (`groups`: name -> task names, in table order)."""

    def __init__(self, tasks: dict[str, TaskSpec], groups: dict[str, tuple[str, ...]], path: Path):
        super().__init__(tasks)
        self.groups, self.path = groups, path


@cache
def load_registry(path: Path = REGISTRY_FILE) -> TaskRegistry:
    """The task records of a registry file and its groups (`groups: {NAME: [TASK, ...]}`, each task one of the
    file's; `all` is every group's tasks in order unless the file names its own)."""
    if not Path(path).is_file():
        raise ConfigError(f"task registry {path} does not exist; pass task_registry=FILE.yaml or leave it null")
    with Path(path).open(encoding="utf-8") as handle:
        content = yaml.safe_load(handle)
    if not isinstance(content, dict) or not isinstance(content.get("tasks"), dict):
        raise ConfigError(f"task registry {path}: expected a mapping with 'tasks: {{NAME: record, ...}}'")
    records = content["tasks"]
    missing = [(name, key) for name, record in records.items() for key in ("format", "split", "main_score")
               if not isinstance(record, dict) or key not in record]
    if missing:
        name, key = missing[0]
        raise ConfigError(f"task registry {path}: task {name} has no {key!r}; every record names its format, split "
                          "and main_score")
    tasks = {
        name: TaskSpec(
            name=name,
            format=record["format"],
            split=record["split"],
            pairs=int(record["pairs"] if "pairs" in record else record.get("size", 0)),
            main_score=record["main_score"],
            record=record,
            family=record.get("family", "sts"),
        )
        for name, record in records.items()
    }
    groups = {str(name): tuple(members or ()) for name, members in (content.get("groups") or {}).items()}
    for group, members in groups.items():
        if unknown := [member for member in members if member not in tasks]:
            raise ConfigError(f"task registry {path}: group {group} names {unknown[0]!r}, which is not one of its "
                              "tasks")
    if groups and ALL not in groups:
        groups[ALL] = tuple(dict.fromkeys(task for members in groups.values() for task in members))
    return TaskRegistry(tasks, groups, Path(path))


def task_groups(registry: dict[str, TaskSpec]) -> dict[str, tuple[str, ...]]:
    """The named groups of `registry` (none for a plain dict of records)."""
    return getattr(registry, "groups", {})


def expand_task_names(names: list[str] | tuple[str, ...], registry: dict[str, TaskSpec]) -> list[str]:
    """Task names with each of the registry's groups (`sts`, `transfer`, `clustering`, `all` in data/tasks.yaml)
    replaced by its tasks; duplicates dropped, first occurrence kept. A task name takes precedence over a group of
    the same name."""
    groups = task_groups(registry)
    expanded: list[str] = []
    for name in names:
        members = [name] if name in registry or name not in groups else list(groups[name])
        expanded += [task for task in members if task not in expanded]
    return expanded


def get_tasks(names: list[str] | tuple[str, ...], registry: dict[str, TaskSpec] | None = None) -> list[TaskSpec]:
    """The task records of `names` (task names and groups, mixed freely, e.g. [MR, agnews] or [sts, TREC])."""
    registry = registry if registry is not None else load_registry()
    groups = task_groups(registry)
    valid = f"valid tasks: {', '.join(registry)}" + (f"; valid groups: {', '.join(groups)}" if groups else "")
    unknown = [name for name in names if name not in registry and name not in groups]
    if unknown:
        raise ConfigError(f"unknown task {', '.join(unknown)}; {valid}")
    expanded = expand_task_names(names, registry)
    if not expanded:
        raise ConfigError(f"no tasks given; {valid}")
    return [registry[name] for name in expanded]
