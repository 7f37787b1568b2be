"""Learning-rate schedules for `configs/scheduler/` (instantiated as partials; the module passes the optimizer and the
number of optimiser steps the run will take). The warm-up is a fraction of those steps, so one setting serves any
run length."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

from promptemb.common.bounds import Fraction


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    return int(warmup_ratio * total_steps)


def linear_warmup_decay(optimizer: Optimizer, total_steps: int, warmup_ratio: Fraction = 0.0) -> LambdaLR:
    """Linear warm-up from 0 over `warmup_ratio` of the steps, then linear decay to 0 at `total_steps`."""
    return get_linear_schedule_with_warmup(optimizer, warmup_steps(total_steps, warmup_ratio), total_steps)


def constant_after_warmup(optimizer: Optimizer, total_steps: int, warmup_ratio: Fraction = 0.0) -> LambdaLR:
    """Linear warm-up from 0 over `warmup_ratio` of the steps, then the optimizer's learning rate unchanged."""
    return get_constant_schedule_with_warmup(optimizer, warmup_steps(total_steps, warmup_ratio))
