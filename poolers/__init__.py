"""Training-free poolers: pure functions from an `EncoderOutput` to one vector per sentence."""

from promptemb.poolers.base import Needs, Pooler
from promptemb.poolers.registry import POOLERS, build_pooler, build_poolers, register_pooler

__all__ = ["POOLERS", "Needs", "Pooler", "build_pooler", "build_poolers", "register_pooler"]
