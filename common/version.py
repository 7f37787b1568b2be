"""The installed promptemb version (importlib.metadata), recorded in every result's provenance and every export."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

UNKNOWN = "unknown (not installed: pip install .)"


def framework_version() -> str:
    try:
        return version("promptemb")
    except PackageNotFoundError:
        return UNKNOWN
