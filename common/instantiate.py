"""Hydra's `instantiate` for this project's configs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from promptemb.common.errors import UserError


def build(node, **kwargs):
    """`hydra.utils.instantiate` with `_convert_="all"`; a user mistake raised inside a constructor comes out as
    that one-line `UserError`, not wrapped in Hydra's multi-line InstantiationException."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        while cause is not None and not isinstance(cause, UserError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


#: The attribute `keywords_of` sets on a factory: the settings dataclasses its `**keywords` are the fields of.
KEYWORD_SETTINGS = "keyword_settings"


def keywords_of(*settings: type) -> Callable:
    """Decorator of a factory whose `**keywords` are the fields of these dataclasses (a config node keeps its flat
    keys; the factory turns them into settings objects with `split_keywords`). The config checker
    (common/validation.py) types every key by its field and refuses keys no field has."""

    def mark(factory: Callable) -> Callable:
        setattr(factory, KEYWORD_SETTINGS, settings)
        return factory

    return mark


def split_keywords(keywords: dict, *settings: type) -> list:
    """One instance of each settings dataclass from `keywords` (each key goes to the class with that field); a key
    no class has is a TypeError, as for a constructor."""
    values: list[dict] = [{} for _ in settings]
    for key, value in keywords.items():
        owner = next((i for i, kind in enumerate(settings) if key in {f.name for f in dataclasses.fields(kind)}), None)
        if owner is None:
            valid = sorted(f.name for kind in settings for f in dataclasses.fields(kind))
            raise TypeError(f"unexpected keyword {key!r}; valid: {', '.join(valid)}")
        values[owner][key] = value
    return [kind(**given) for kind, given in zip(settings, values, strict=True)]
