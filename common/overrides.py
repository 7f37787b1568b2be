"""Hydra command-line overrides, parsed: which keys a multirun sweeps and over which values."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser


def parse_overrides(overrides: list[str]) -> list:
    return OverridesParser.create().parse_overrides(overrides)


def sweep_values(override) -> list[str]:
    """The values a parsed multirun override sweeps over (`a,b`, `choice(a,b)`, `range(...)`); [] when not a sweep
    or not enumerable (Optuna's `interval(...)`)."""
    if not override.is_sweep_override():
        return []
    try:
        return list(override.sweep_string_iterator())
    except Exception:  # interval sweeps have no values to list
        return []


def first_of_sweeps(overrides: list[str]) -> list[str]:
    """Multirun overrides as one job's: each sweep (`a=1,2`, `range(...)`, `choice(...)`) replaced by its first
    value; sweeps without one (Optuna's `interval(...)`) are left out of the check."""
    single = []
    for override in parse_overrides(overrides):
        if not override.is_sweep_override():
            single.append(override.input_line)
        elif values := sweep_values(override):
            single.append(f"{override.get_key_element()}={values[0]}")
    return single
