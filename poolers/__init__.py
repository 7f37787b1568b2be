"""Training-free poolers: pure functions from an `EncoderOutput` to one vector per sentence."""

from promptemb.poolers.base import Needs, Pooler
from promptemb.poolers.registry import POOLER_NAMES, build_pooler, build_poolers

__all__ = ["POOLER_NAMES", "Needs", "Pooler", "build_pooler", "build_poolers"]
