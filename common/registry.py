"""Named components built from a class plus default arguments (poolers, post-processors)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from promptemb.common.errors import ConfigError
from promptemb.common.validation import not_a_key

#: The config map each kind's arguments are given in.
ARGUMENT_MAPS = {"pooler": "pooler_args", "post-processor": "post_args"}


def build_named(registry: Mapping[str, tuple[type, dict[str, Any]]], kind: str, valid_label: str, name: str,
                overrides: Mapping[str, Any]) -> Any:
    """`registry[name]`'s class called with `name=name`, its defaults and `overrides`; unknown names and bad
    arguments are one-line `ConfigError`s."""
    if name not in registry:
        raise ConfigError(f"unknown {kind} {name!r}; {valid_label}: {', '.join(registry)}")
    cls, defaults = registry[name]
    parameters = inspect.signature(cls).parameters
    if not any(parameter.kind == parameter.VAR_KEYWORD for parameter in parameters.values()):
        for key in overrides:  # an argument the class does not take: one line naming the closest one it takes
            if key not in parameters:
                raise not_a_key(f"{ARGUMENT_MAPS.get(kind, kind)}.{name}.{key}", [p for p in parameters if p != "name"],
                                f"the {kind} {name!r}", "an argument")
    try:
        return cls(name=name, **{**defaults, **overrides})
    except TypeError as err:
        raise ConfigError(f"bad arguments for {kind} {name!r}: {err}") from None
