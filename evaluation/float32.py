"""Full float32 matrix products for scoring on an accelerator: the transfer classifiers and the device k-means train
and compare in float32 as they do on the CPU, whatever TF32 setting the process runs with (TF32 keeps 10 mantissa
bits, enough to move a k-means assignment or a classifier's early stopping)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """float32 matrix products in full float32 inside the block (`torch.set_float32_matmul_precision("highest")`),
    the process's setting restored afterwards."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
