"""Post-processor names usable in configs (`post=[quantile_u,whiten]`), each a class plus default arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from promptemb.common.errors import ConfigError
from promptemb.common.registry import Registry, build_named
from promptemb.postprocessing.abtt import AllButTheTop
from promptemb.postprocessing.base import PostProcessor
from promptemb.postprocessing.normalize import Normalize
from promptemb.postprocessing.quantile import QuantileUniform
from promptemb.postprocessing.whiten import Whiten
from promptemb.postprocessing.zscore import ZScore

POSTS = Registry("post-processor", "docs/reference.md", "register it with POSTS.register(NAME, (CLASS, DEFAULTS))")
for _name, (_cls, _defaults) in {
    "quantile_u": (QuantileUniform, {}),
    "zscore": (ZScore, {}),
    "whiten": (Whiten, {}),
    "abtt": (AllButTheTop, {}),
    "normalize": (Normalize, {}),
    "quantile_n": (QuantileUniform, {"output_distribution": "normal"}),
}.items():
    POSTS.register(_name, (_cls, _defaults), owner=_cls)
POST_NAMES = tuple(POSTS)

_EXTRACTION_STUDY = ('Stankevičius & Lukoševičius (2024), "Extracting Sentence Embeddings from Pretrained Transformer '
                     'Models"')
#: The paper each registered name follows (docs/reference.md is generated from this and the classes' docstrings).
PAPERS: dict[str, str] = {
    "quantile_u": f"{_EXTRACTION_STUDY}: quantile transform to a uniform distribution",
    "quantile_n": f"{_EXTRACTION_STUDY}: quantile normalisation to a Gaussian",
    "zscore": f"{_EXTRACTION_STUDY}: per-dimension standardisation",
    "whiten": 'Su et al. (2021), "Whitening Sentence Representations for Better Semantics and Faster Retrieval", '
              "Eq. 5-7",
    "abtt": 'Mu & Viswanath (2018), "All-but-the-Top: Simple and Effective Postprocessing for Word Representations", '
            "Algorithm 1",
    "normalize": "unit length, so that the dot product is the cosine (no paper of its own)",
}


def build_post(name: str, **overrides: Any) -> PostProcessor:
    return build_named(POSTS, "post-processor", name, overrides)


def check_post_names(names: list[str], post_args: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Every name registered, none twice, no `post_args` for a post-processor not asked for; one line each."""
    post_args = dict(post_args or {})
    for name in names:
        if name not in POSTS:
            raise POSTS.unknown(name)
    if len(set(names)) != len(names):
        raise ConfigError(f"post-processor listed twice in {list(names)}")
    stray = set(post_args) - set(names)
    if stray:
        raise ConfigError(f"post_args given for {', '.join(sorted(stray))}, which is not in post={list(names)}")


def build_posts(names: list[str], post_args: Mapping[str, Mapping[str, Any]] | None = None) -> list[PostProcessor]:
    check_post_names(names, post_args)
    return [build_post(name, **dict((post_args or {}).get(name, {}))) for name in names]
