"""Timing helper shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_time(fn: Callable[[], Any], repeats: int, warm_up: bool = True) -> tuple[float, Any]:
    """Best wall time of `repeats` calls of `fn` (after one untimed warm-up call unless `warm_up=False`), and the
    last result."""
    fn_result = fn() if warm_up else None
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn_result = fn()
        best = min(best, time.perf_counter() - start)
    return best, fn_result
