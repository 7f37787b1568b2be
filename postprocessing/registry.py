"""Post-processor names usable in configs (`post=[quantile_u,whiten]`), each a class plus default arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.errors import ConfigError
from common.registry import build_named
from postprocessing.abtt import AllButTheTop
from postprocessing.base import PostProcessor
from postprocessing.normalize import Normalize
from postprocessing.quantile import QuantileUniform
from postprocessing.whiten import Whiten
from postprocessing.zscore import ZScore

_REGISTRY: dict[str, tuple[type[PostProcessor], dict[str, Any]]] = {
    "quantile_u": (QuantileUniform, {}),
    "zscore": (ZScore, {}),
    "whiten": (Whiten, {}),
    "abtt": (AllButTheTop, {}),
    "normalize": (Normalize, {}),
    "quantile_n": (QuantileUniform, {"output_distribution": "normal"}),
}
POST_NAMES = tuple(_REGISTRY)


def build_post(name: str, **overrides: Any) -> PostProcessor:
    return build_named(_REGISTRY, "post-processor", "valid", name, overrides)


def build_posts(names: list[str], post_args: Mapping[str, Mapping[str, Any]] | None = None) -> list[PostProcessor]:
    post_args = dict(post_args or {})
    if len(set(names)) != len(names):
        raise ConfigError(f"post-processor listed twice in {list(names)}")
    stray = set(post_args) - set(names)
    if stray:
        raise ConfigError(f"post_args given for {', '.join(sorted(stray))}, which is not in post={list(names)}")
    return [build_post(name, **dict(post_args.get(name, {}))) for name in names]
