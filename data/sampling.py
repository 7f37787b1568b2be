"""The training order: a pure function of (seed, epoch), resumable at any batch.

Every rank draws the same permutation of the corpus for an epoch (`torch.randperm` on a generator seeded with
seed + epoch), takes its own strided share of it (as `DistributedSampler` does: rank r gets positions r, r + W, ...)
and drops the tail that does not fill a whole global batch. A resumed run skips the batches its checkpoint had
already trained on in that epoch, so it continues with exactly the batches the uninterrupted run would have seen.
The sampler runs in the main process, so dataloader workers never influence the order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler


@dataclass(frozen=True)
class DataPosition:
    """Where training stands in the data: `batches_done` batches of epoch `epoch` have been trained on."""

    epoch: int = 0
    batches_done: int = 0


class EpochSampler(Sampler[int]):
    def __init__(self, num_examples: int, per_device_batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, resume_at: DataPosition | None = None):
        self.num_examples = num_examples
        self.per_device_batch_size = per_device_batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.resume_at = resume_at or DataPosition()
        self.epoch = self.resume_at.epoch

    @property
    def batches_per_epoch(self) -> int:
        return self.num_examples // (self.per_device_batch_size * self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch."""
        self.epoch = epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's indices for `epoch`, whole batches only, from the first batch of the epoch."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        permutation = torch.randperm(self.num_examples, generator=generator)
        used = self.batches_per_epoch * self.per_device_batch_size * self.world_size
        return permutation[:used][self.rank::self.world_size].tolist()

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order(self.epoch)
        if self.epoch == self.resume_at.epoch:
            order = order[self.resume_at.batches_done * self.per_device_batch_size:]
        return iter(order)

    def __len__(self) -> int:
        """The full epoch (Lightning's batch count and progress bar); a resumed epoch yields only its rest."""
        return self.batches_per_epoch * self.per_device_batch_size
