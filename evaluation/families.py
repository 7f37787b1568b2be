"""The evaluation families by name, and a task list that mixes them scored in one result.

The built-ins are `sts` (evaluation/sts.py), `transfer` (evaluation/transfer.py) and `clustering`
(evaluation/clustering.py); a user's own family registers from its module, which `imports=[MODULE]` imports before
the config is checked (docs/extending.md):

    from promptemb.evaluation.families import EvaluationFamily, register_family

    @register_family("my_family")
    class MyFamily(EvaluationFamily): ...

A task record names its family (`family: my_family`); `family_args.NAME.*` sets a family's own settings. A task
whose family is not registered, a `family_args` entry for a family that is not, and a setting the family does not
have are each one line before any model loads.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from promptemb.common.errors import ConfigError
from promptemb.common.registry import Registry, choices_hint
from promptemb.common.validation import check_value, not_a_key
from promptemb.data.tasks import TaskSpec
from promptemb.encoder.model import Encoder
from promptemb.evaluation.clustering import ClusteringFamily
from promptemb.evaluation.family import EvaluationFamily, IndexedTask
from promptemb.evaluation.scoring_options import DEFAULT_OPTIONS, ScoringOptions
from promptemb.evaluation.sts import STSFamily
from promptemb.evaluation.transfer import TransferFamily
from promptemb.poolers.base import Pooler

__all__ = ["FAMILIES", "EvaluationFamily", "IndexedTask", "build_families", "check_task_families", "evaluate_tasks",
           "register_family"]

FAMILIES = Registry("evaluation family", "docs/evaluation.md", 'decorate the class with @register_family("NAME") '
                    "(promptemb.evaluation.families) in its module and pass imports=[MODULE]")
for _family in (STSFamily, TransferFamily, ClusteringFamily):  # in this order in every result
    FAMILIES.register(_family.name, _family)


def register_family(name: str) -> Callable[[type[EvaluationFamily]], type[EvaluationFamily]]:
    """Class decorator: tasks whose record says `family: NAME` are scored by the class (an `EvaluationFamily`), with
    `family_args.NAME` as its settings."""
    def register(cls: type[EvaluationFamily]) -> type[EvaluationFamily]:
        if not (isinstance(cls, type) and issubclass(cls, EvaluationFamily)):
            raise TypeError(f"@register_family({name!r}) decorates an EvaluationFamily subclass, not {cls!r}")
        FAMILIES.register(name, cls)
        cls.name = name
        return cls
    return register


def family_settings(cls: type[EvaluationFamily], values: Mapping[str, Any] | None, key: str) -> Any:
    """`cls.Settings` built from `values` (lists become tuples); a field it does not have is one line naming the
    closest, settings for a family that takes none are one line too."""
    values = dict(values or {})
    if cls.Settings is None:
        if values:
            raise ConfigError(f"{key}: the {cls.name} family has no settings; drop {key}")
        return None
    valid = list(getattr(cls.Settings, "__dataclass_fields__", {}))
    try:
        hints = typing.get_type_hints(cls.Settings, include_extras=True)
    except (NameError, TypeError):  # hints that do not resolve: the dataclass takes its values unchecked
        hints = {}
    for name, value in values.items():
        if name not in valid:
            raise not_a_key(f"{key}.{name}", valid, f"{key} ({cls.Settings.__name__})")
        check_value(f"{key}.{name}", list(value) if isinstance(value, tuple) else value,  # as YAML gives it
                    hints.get(name, Any))  # its type and bounds, as every config value
    try:
        return cls.Settings(**{name: tuple(value) if isinstance(value, list) else value
                               for name, value in values.items()})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key}: {str(err).strip().splitlines()[0]}") from None


def build_families(family_args: Mapping[str, Mapping[str, Any]] | None = None,
                   key: str = "family_args") -> dict[str, EvaluationFamily]:
    """Every registered family, each with its settings from `family_args` (name -> settings); a name no family is
    registered under is one line."""
    family_args = dict(family_args or {})
    for name, values in family_args.items():
        if name not in FAMILIES:
            raise ConfigError(f"{key}.{name}: there is no evaluation family {name!r}; "
                              f"{choices_hint(name, list(FAMILIES), FAMILIES.listed_in)} (a family of your own: "
                              f"pass imports=[MODULE] with the module that registers it)")
        if values is not None and not isinstance(values, Mapping):
            raise ConfigError(f"{key}.{name}={values!r}: expected a mapping of the {name} family's settings, e.g. "
                              f"+{key}.{name}.SETTING=VALUE")
    return {name: cls(family_settings(cls, family_args.get(name), f"{key}.{name}")) for name, cls in FAMILIES.items()}


def check_task_families(tasks: Sequence[TaskSpec], registry_file: str | Path) -> None:
    """Every task's family is registered: else one line naming the task, its family and `imports=`."""
    for spec in tasks:
        if spec.family not in FAMILIES:
            raise ConfigError(
                f"task {spec.name} ({registry_file}) is scored by the evaluation family {spec.family!r}, which is not "
                f"registered: pass imports=[MODULE] naming the module that registers it "
                f"(@register_family({spec.family!r})); registered: {', '.join(FAMILIES)}")


def evaluate_tasks(
    encoder: Encoder,
    tasks: Sequence[TaskSpec],
    root: Path,
    poolers: Sequence[Pooler],
    options: ScoringOptions = DEFAULT_OPTIONS,
    analysis: bool = False,
    families: Mapping[str, EvaluationFamily] | None = None,
) -> dict:
    """Score a task list that mixes families: each family's tasks through the family (`families`: the instances with
    the run's settings, default every registered family with its defaults), one result.

    Every task's data is read and verified before any encoding. The result has the shape of a family's call for the
    first family present (in the registry's order: sts, transfer, clustering, then the user's), so STS-only
    consumers read `scores` as before, plus `families`: {family: {"scores", "pearson", "details", "timing",
    "protocol"}} for every family in the run. `analysis`: the geometry metrics, for the families that have them."""
    families = families if families is not None else build_families()
    check_task_families(tasks, "the task registry")
    by_family = {name: [spec for spec in tasks if spec.family == name] for name in FAMILIES}
    by_family = {name: specs for name, specs in by_family.items() if specs}
    read = {name: [(spec, families[name].read(spec, root)) for spec in specs] for name, specs in by_family.items()}
    results: dict[str, dict] = {}
    for name, loaded in read.items():
        family = families[name]
        started = time.perf_counter()
        result = family.score(encoder, loaded, root, poolers, options, family.analyser() if analysis else None)
        result["timing"] = {**result["timing"], "total_s": round(time.perf_counter() - started, 2)}
        results[name] = result
    first = next(iter(results.values()))
    merged = {
        "scores": first["scores"], "pearson": first.get("pearson"), "details": first["details"],
        "analysis": first.get("analysis"),
        "families": {family: {key: result.get(key) for key in ("scores", "pearson", "details", "timing", "protocol")}
                     for family, result in results.items()},
        "poolers": {}, "post_processing": {}, "fit_corpora": {}, "tasks": {}, "unique_sentences": 0,
    }
    for result in results.values():
        merged["poolers"].update(result["poolers"])
        merged["post_processing"].update(result["post_processing"] or {})
        merged["fit_corpora"].update(result["fit_corpora"])
        merged["tasks"].update(result["tasks"])
        merged["unique_sentences"] += result["unique_sentences"]
    merged["post_processing"] = merged["post_processing"] or None
    return merged
