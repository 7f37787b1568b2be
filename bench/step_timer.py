"""A Lightning callback that times the real training loop of a train.py run and writes one JSON record at fit end:
optimiser steps, steps/s over the loop after `warmup` steps (evaluations and checkpoints included, as a user waits
for them), the median step (batch start to batch end, evaluation steps included), peak memory.

    python train.py ... +callbacks.step_timer._target_=bench.step_timer.StepTimer +callbacks.step_timer.out=PATH

bench/gpu_validation.py adds it to each recipe's command. On CUDA the clock is read after a synchronisation at the two
ends of the timed span only, so the loop runs as it does without the timer."""

from __future__ import annotations

import json
import resource
import statistics
import time
from pathlib import Path

import pytorch_lightning as pl
import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(pl.Callback):
    def __init__(self, out: str, warmup: int = 2):
        self.out = Path(out)
        self.warmup = warmup
        self.started: float | None = None
        self.batch_started = 0.0
        self.steps: list[float] = []
        self.timed_from_step = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.started is None and trainer.global_step >= self.warmup:
            synchronize(pl_module.device)
            self.started, self.timed_from_step = time.perf_counter(), trainer.global_step
        self.batch_started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append(time.perf_counter() - self.batch_started)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        device = trainer.strategy.root_device
        synchronize(device)
        ended = time.perf_counter()
        timed = trainer.global_step - self.timed_from_step
        record = {
            "optimizer_steps": trainer.global_step,
            "timed_steps": timed if self.started is not None else 0,
            "steps_per_s": round(timed / (ended - self.started), 3) if self.started is not None and timed else None,
            "median_step_s": round(statistics.median(self.steps), 4) if self.steps else None,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "peak_memory_gib": round((torch.cuda.max_memory_allocated(device) if device.type == "cuda" else
                                      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30, 2),
            "peak_memory_kind": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process max RSS",
        }
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(record, indent=1))
