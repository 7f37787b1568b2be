"""Helpers shared by the poolers; the pooler contract itself (`Needs`, `Pooler`) is the encoder's
(`encoder/pooling.py`), re-exported here for the poolers."""

from __future__ import annotations

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput
from promptemb.encoder.pooling import Needs, Pooler

__all__ = ["Needs", "Pooler", "masked_mean", "pooled_tokens", "require_template_for"]


def pooled_tokens(out: EncoderOutput, include_mask: bool = True) -> torch.Tensor:
    """0/1 `[B, T]` of the tokens to pool: every non-padding token, minus the template's [MASK] tokens when
    `include_mask` is False (Stankevičius & Lukoševičius's templated average "without [MASK]")."""
    if include_mask:
        return out.attention_mask
    return out.attention_mask * (~out.mask_token).to(out.attention_mask.dtype)


def require_template_for(name: str, templated: bool, include_mask: bool) -> None:
    """`include_mask=False` only means something on a templated input (a plain input has no [MASK])."""
    if not include_mask and not templated:
        raise ConfigError(f"pooler {name!r}: include_mask=false needs templated=true (a plain input has no [MASK])")


def masked_mean(states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_t w_t·h_t / Σ_t w_t over the token axis; `states` [B, T, D], `weights` [B, T] (0/1 or soft)."""
    weights = weights.to(states.dtype)
    return (states * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp_min(1e-9)
