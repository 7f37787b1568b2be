"""One exception type for every user mistake, so entry points can print one line and exit non-zero."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """A problem the user can fix (bad config, missing/corrupt data, bad input file).

    The message must say what is wrong and how to fix it, on one line.
    """


class ConfigError(UserError):
    """Invalid configuration: unknown names, malformed templates, impossible layer indices."""


class DataError(UserError):
    """Missing, malformed or corrupt data files."""


class DivergenceError(UserError):
    """Training produced a non-finite loss, dev score or weights: the run stops at that step and writes nothing
    from that state (the last good checkpoint stays as it was)."""


class PreemptedError(UserError):
    """SIGTERM (preemption): a checkpoint was saved at the batch boundary; the message says how to resume."""

    exit_code = 143  # 128 + SIGTERM, what schedulers expect from a terminated job


def exit_with(err: UserError) -> NoReturn:
    """The one-line `error: ...` on stderr and the error's exit code (2 unless its class says otherwise)."""
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(getattr(err, "exit_code", 2))


def exit_on_user_error(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn a `UserError` raised by an entry point into one `error: ...` line on stderr and its exit code (2 unless
    the error class says otherwise)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            exit_with(err)

    return wrapper
