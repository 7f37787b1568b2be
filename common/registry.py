"""Named components a config may ask for by name: recipes, poolers, post-processors, evaluation families.

Each kind has one `Registry`. The built-ins register themselves where they are defined; a user's own component
registers the same way in the user's module, which `imports=[MODULE]` (or a `promptemb.plugins` entry point of an
installed package: common/plugins.py) imports before the config is checked. A name is registered once: a user's
component cannot take a built-in's name, and two different components cannot share one.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from promptemb.common.errors import ConfigError
from promptemb.common.validation import not_a_key

#: The config map each kind's arguments are given in.
ARGUMENT_MAPS = {"pooler": "pooler_args", "post-processor": "post_args"}
BUILTIN_PACKAGE = "promptemb."


def qualified_name(value: Any) -> str:
    """`module.QualName` of a class or function (what a registration is recognised by)."""
    target = getattr(value, "func", value)  # a functools.partial names the function it wraps
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"


def closest(name: str, names: list[str], count: int = 3) -> list[str]:
    return difflib.get_close_matches(name, names, n=count, cutoff=0.6)


def choices_hint(name: str, names: list[str], listed_in: str, count: int = 3) -> str:
    """'did you mean a, b? valid: ...' for a short list; for a long one the closest few and where all are listed,
    so that the message stays one readable line as the project grows."""
    guesses = closest(name, names, count)
    guess = f"did you mean {' or '.join(guesses)}? " if guesses else ""
    if len(names) <= 12:
        return f"{guess}valid: {', '.join(names)}"
    return f"{guess}all {len(names)} are listed in {listed_in}"


class Registry(Mapping[str, Any]):
    """name -> value (a class, or a (class, default arguments) pair) of one kind of component."""

    def __init__(self, kind: str, listed_in: str, how_to_register: str):
        self.kind, self.listed_in, self.how_to_register = kind, listed_in, how_to_register
        self._values: dict[str, Any] = {}
        self._owners: dict[str, str] = {}

    def register(self, name: str, value: Any, owner: Any = None) -> Any:
        """Register `value` under `name` (`owner`: what it is recognised by, default `value` itself). The same owner
        registering again (its module imported twice) is no change; another owner under a taken name is refused."""
        who = qualified_name(value if owner is None else owner)
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{who}: {self.kind} name {name!r} must be an identifier (letters, digits, _)")
        known = self._owners.get(name)
        if known is not None and known != who:
            builtin = known.startswith(BUILTIN_PACKAGE)
            taken = f"the built-in {self.kind} {name!r}" if builtin else f"{self.kind} {name!r}, taken by {known}"
            raise ConfigError(f"{who} cannot be registered as {taken}; register it under another name")
        self._values[name], self._owners[name] = value, who
        return value

    def decorator(self, name: str) -> Callable[[Any], Any]:
        def register(value: Any) -> Any:
            return self.register(name, value)
        return register

    def owner(self, name: str) -> str:
        return self._owners[name]

    def name_of(self, value: Any) -> str | None:
        """The name `value` (a class or function) is registered under, if any."""
        who = qualified_name(value)
        return next((name for name, owner in self._owners.items() if owner == who), None)

    def unknown(self, name: str, where: str | None = None) -> ConfigError:
        return ConfigError(f"unknown {self.kind} {name!r}{f' in {where}' if where else ''}; "
                           f"{choices_hint(name, list(self), self.listed_in)}")

    def get_or_refuse(self, name: str, where: str | None = None) -> Any:
        if name not in self._values:
            raise self.unknown(name, where)
        return self._values[name]

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def build_named(registry: Mapping[str, tuple[type, dict[str, Any]]], kind: str, name: str,
                overrides: Mapping[str, Any]) -> Any:
    """`registry[name]`'s class called with `name=name`, its defaults and `overrides`; unknown names and bad
    arguments are one-line `ConfigError`s."""
    if name not in registry:
        raise registry.unknown(name) if isinstance(registry, Registry) else ConfigError(f"unknown {kind} {name!r}")
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
