"""A Lightning callback that times the training steps of a real train.py run and writes one JSON record at fit end:
optimiser steps, training steps/s after `warmup` steps (the steps alone: each step from its batch start to its batch
end, before any evaluation or checkpoint callback runs at that step), the median step, the loop's steps/s as a user
waits for it (evaluations, checkpoints and data loading included), peak memory.

    python train.py ... +callbacks.step_timer._target_=bench.step_timer.StepTimer +callbacks.step_timer.out=PATH

bench/gpu_validation.py adds it to each recipe's command. The timer moves itself to the front of the trainer's
callbacks, so its batch-end hook runs before the STS evaluation and the checkpoint callbacks of the same step. On
CUDA it synchronises at each step's start and end (the steps' kernels are inside their span; the host no longer runs
ahead across a step boundary, which costs the loop a little overlap).
"""

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
        self.loop_started: float | None = None
        self.loop_from_step = 0
        self.batch_started = 0.0
        self.steps: list[float] = []  # the timed steps' durations (after the warm-up)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.callbacks and trainer.callbacks[0] is not self:
            trainer.callbacks.remove(self)
            trainer.callbacks.insert(0, self)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        synchronize(pl_module.device)
        self.batch_started = time.perf_counter()
        if self.loop_started is None and trainer.global_step >= self.warmup:
            self.loop_started, self.loop_from_step = self.batch_started, trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        synchronize(pl_module.device)
        if self.loop_started is not None:
            self.steps.append(time.perf_counter() - self.batch_started)

    def on_train_end(self, trainer, pl_module) -> None:
        synchronize(pl_module.device)
        self.loop_ended = time.perf_counter()

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        device = trainer.strategy.root_device
        ended = getattr(self, "loop_ended", None) or time.perf_counter()
        loop_steps = trainer.global_step - self.loop_from_step if self.loop_started is not None else 0
        record = {
            "optimizer_steps": trainer.global_step,
            "timed_steps": len(self.steps),
            "steps_per_s": round(len(self.steps) / sum(self.steps), 3) if self.steps else None,
            "median_step_s": round(statistics.median(self.steps), 4) if self.steps else None,
            "loop_steps_per_s": round(loop_steps / (ended - self.loop_started), 3) if loop_steps else None,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "peak_memory_gib": round((torch.cuda.max_memory_allocated(device) if device.type == "cuda" else
                                      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30, 2),
            "peak_memory_kind": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process max RSS",
        }
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(record, indent=1))
