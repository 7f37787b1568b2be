"""Named components built from a class plus default arguments (poolers, post-processors)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptemb.common.errors import ConfigError


def build_named(registry: Mapping[str, tuple[type, dict[str, Any]]], kind: str, valid_label: str, name: str,
                overrides: Mapping[str, Any]) -> Any:
    """`registry[name]`'s class called with `name=name`, its defaults and `overrides`; unknown names and bad
    arguments are one-line `ConfigError`s."""
    if name not in registry:
        raise ConfigError(f"unknown {kind} {name!r}; {valid_label}: {', '.join(registry)}")
    cls, defaults = registry[name]
    try:
        return cls(name=name, **{**defaults, **overrides})
    except TypeError as err:
        raise ConfigError(f"bad arguments for {kind} {name!r}: {err}") from None
