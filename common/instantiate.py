"""Hydra's `instantiate` for this project's configs."""

from __future__ import annotations

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
