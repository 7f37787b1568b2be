"""Learning-rate schedules for `configs/scheduler/` (instantiated as partials; the module passes the optimizer and the
number of optimiser steps the run will take). The warm-up is a fraction of those steps, so one setting serves any
run length. The factors are transformers' `get_linear_schedule_with_warmup` / `get_constant_schedule_with_warmup`
(tests/configs/test_configs.py compares them step by step), written here so that checking a config does not import
transformers."""

from __future__ import annotations

import functools

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from promptemb.common.bounds import Fraction


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    return int(warmup_ratio * total_steps)


def linear_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return float(step) / float(max(1, warmup))
    return max(0.0, float(total - step) / float(max(1, total - warmup)))


def constant_factor(step: int, warmup: int) -> float:
    return float(step) / float(max(1.0, warmup)) if step < warmup else 1.0


def linear_warmup_decay(optimizer: Optimizer, total_steps: int, warmup_ratio: Fraction = 0.0) -> LambdaLR:
    """Linear warm-up from 0 over `warmup_ratio` of the steps, then linear decay to 0 at `total_steps`."""
    warmup = warmup_steps(total_steps, warmup_ratio)
    return LambdaLR(optimizer, functools.partial(linear_factor, warmup=warmup, total=total_steps))


def constant_after_warmup(optimizer: Optimizer, total_steps: int, warmup_ratio: Fraction = 0.0) -> LambdaLR:
    """Linear warm-up from 0 over `warmup_ratio` of the steps, then the optimizer's learning rate unchanged."""
    return LambdaLR(optimizer, functools.partial(constant_factor, warmup=warmup_steps(total_steps, warmup_ratio)))
