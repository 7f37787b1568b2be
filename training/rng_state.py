"""Random-number state in checkpoints, so a resumed run draws the same dropout masks as the uninterrupted one.

Lightning restores weights, optimiser, schedule and loop counters but not the generators. This callback saves the
global torch (CPU and the process's own CUDA device), numpy and Python states with every checkpoint and restores them
just before the first batch a resumed run trains on, so whatever ran in between (model construction, the data
loader, hooks) cannot shift them. Stored as tensors and plain containers: checkpoints stay loadable with
`torch.load(weights_only=True)`.
Under DDP every rank's state is gathered into the checkpoint and each rank restores its own: ranks draw different
amounts (their batches pad to different lengths), so one shared state would not continue any of them exactly.
"""

from __future__ import annotations

import random

import numpy as np
import pytorch_lightning as pl
import torch
import torch.distributed as dist


def capture() -> dict:
    name, keys, position, has_gauss, cached_gauss = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        # this process's own device only: a state per visible device could not be restored where fewer are visible
        # (a run resumed on fewer GPUs), and under DDP each rank's device is its own anyway
        "cuda": torch.cuda.get_rng_state(torch.cuda.current_device()) if torch.cuda.is_available() else [],
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gauss": float(cached_gauss)},
        "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }


def restore(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        saved_cuda = state["cuda"]
        if isinstance(saved_cuda, list | tuple):  # checkpoints written before: one state per visible device
            saved_cuda = saved_cuda[device] if device < len(saved_cuda) else None
        if saved_cuda is not None and len(saved_cuda):
            torch.cuda.set_rng_state(saved_cuda, device)
    saved = state["numpy"]
    np.random.set_state((saved["name"], saved["keys"].numpy().astype(np.uint32), saved["position"],
                         saved["has_gauss"], saved["cached_gauss"]))
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss_next"]))


class RandomStateCallback(pl.Callback):
    def __init__(self):
        self.pending: list[dict] | None = None

    def state_dict(self) -> dict:
        """Called on every rank when a checkpoint is saved (Lightning dumps it everywhere, rank 0 writes it)."""
        state = capture()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states: list = [None] * dist.get_world_size()
            dist.all_gather_object(states, state)
            return {"ranks": states}
        return {"ranks": [state]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.pending = state_dict["ranks"]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.pending is not None:
            same_world = len(self.pending) == trainer.world_size
            restore(self.pending[trainer.global_rank] if same_world else self.pending[0])
            self.pending = None
