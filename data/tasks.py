"""The STS task registry: `tasks.yaml` holds one record per task; this module validates and loads them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from common.errors import ConfigError, DataError
from data.checksums import verify_file
from data.readers import SentencePairs, read_sick, read_sts_subset, read_stsb

REGISTRY_FILE = Path(__file__).with_name("tasks.yaml")

#: The seven tasks every published table reports, in table order.
STS_SUITE = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    format: str  # sts_year | stsb | sick
    split: str
    pairs: int
    main_score: str
    record: dict[str, Any]

    def files(self) -> dict[str, str]:
        """Every file the task reads, relative path -> expected sha256."""
        if self.format == "sts_year":
            return {
                entry[role]["path"]: entry[role]["sha256"]
                for entry in self.record["subsets"]
                for role in ("input", "gold")
            }
        return {self.record["file"]["path"]: self.record["file"]["sha256"]}

    def load(self, root: Path) -> SentencePairs:
        """Verify every file's sha256, read the pairs and check the scored-pair count."""
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
        if len(pairs) != self.pairs:
            raise DataError(f"task {self.name}: read {len(pairs)} scored pairs, expected {self.pairs}")
        return pairs


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
            pairs=int(record["pairs"]),
            main_score=record["main_score"],
            record=record,
        )
        for name, record in records.items()
    }


def get_tasks(names: list[str] | tuple[str, ...], registry: dict[str, TaskSpec] | None = None) -> list[TaskSpec]:
    registry = registry if registry is not None else load_registry()
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ConfigError(f"unknown task {', '.join(unknown)}; valid tasks: {', '.join(registry)}")
    if not names:
        raise ConfigError(f"no tasks given; valid tasks: {', '.join(registry)}")
    return [registry[name] for name in names]
