"""The task registry: `tasks.yaml` holds one record per task (STS, SentEval transfer, short-text clustering); this
module validates and loads them, and resolves task names and groups (`sts`, `transfer`, `clustering`, `all`)."""

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

#: The seven tasks every published table reports, in table order.
STS_SUITE = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
TRANSFER_SUITE = ("MR", "CR", "SUBJ", "MPQA", "SST2", "SST5", "TREC", "MRPC", "SICK-E")
CLUSTERING_SUITE = ("agnews", "biomedical", "googlenews-TS", "googlenews-T", "googlenews-S", "searchsnippets",
                    "stackoverflow", "tweet")
#: Task groups a task list may name; each expands to its suite, in table order.
TASK_GROUPS = {"sts": STS_SUITE, "transfer": TRANSFER_SUITE, "clustering": CLUSTERING_SUITE,
               "all": STS_SUITE + TRANSFER_SUITE + CLUSTERING_SUITE}
FAMILIES = ("sts", "transfer", "clustering")
TRANSFER_READERS = {"sst_binary", "sst_fine", "trec", "mrpc", "sick_entailment"}


@dataclass(frozen=True)
class TaskSpec:
    name: str
    format: str  # sts_year | stsb | sick | binary | sst_binary | sst_fine | trec | mrpc | sick_entailment | clustering
    split: str
    pairs: int  # STS: scored pairs; transfer: examples of the scored split (all of them under CV); clustering: rows
    main_score: str
    record: dict[str, Any]
    family: str = "sts"

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
        elif self.format in TRANSFER_READERS:
            splits, expected = {}, {}
            for split_name, entry in self.record["splits"].items():
                path = paths[entry["path"]]
                if self.format.startswith("sst_"):
                    splits[split_name] = read_sst(path, encoding, fine=self.format == "sst_fine")
                elif self.format == "trec":
                    splits[split_name] = read_trec(path, encoding)
                elif self.format == "mrpc":
                    splits[split_name] = read_mrpc(path, encoding)
                else:
                    splits[split_name] = read_sick_entailment(path, encoding)
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
        if self.family != "sts":
            raise DataError(f"task {self.name} is a {self.family} task, not an STS task with scored pairs")
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


@cache
def load_registry(path: Path = REGISTRY_FILE) -> dict[str, TaskSpec]:
    if not Path(path).is_file():
        raise ConfigError(f"task registry {path} does not exist; pass task_registry=FILE.yaml or leave it null")
    with Path(path).open(encoding="utf-8") as handle:
        records = yaml.safe_load(handle)["tasks"]
    return {
        name: TaskSpec(
            name=name,
            format=record["format"],
            split=record["split"],
            pairs=int(record["pairs"] if "pairs" in record else record["size"]),
            main_score=record["main_score"],
            record=record,
            family=record.get("family", "sts"),
        )
        for name, record in records.items()
    }


def expand_task_names(names: list[str] | tuple[str, ...], registry: dict[str, TaskSpec]) -> list[str]:
    """Task names with each group (`sts`, `transfer`, `clustering`, `all`) replaced by its tasks that the registry
    holds; duplicates dropped, first occurrence kept. A task name takes precedence over a group of the same name."""
    expanded: list[str] = []
    for name in names:
        members = [name] if name in registry or name not in TASK_GROUPS else [
            task for task in TASK_GROUPS[name] if task in registry]
        expanded += [task for task in members if task not in expanded]
    return expanded


def get_tasks(names: list[str] | tuple[str, ...], registry: dict[str, TaskSpec] | None = None) -> list[TaskSpec]:
    """The task records of `names` (task names and groups, mixed freely, e.g. [MR, agnews] or [sts, TREC])."""
    registry = registry if registry is not None else load_registry()
    valid = f"valid tasks: {', '.join(registry)}; valid groups: {', '.join(TASK_GROUPS)}"
    unknown = [name for name in names if name not in registry and name not in TASK_GROUPS]
    if unknown:
        raise ConfigError(f"unknown task {', '.join(unknown)}; {valid}")
    expanded = expand_task_names(names, registry)
    if not expanded:
        raise ConfigError(f"no tasks given; {valid}")
    return [registry[name] for name in expanded]
