"""The training order: a pure function of (seed, epoch), resumable at any batch.

Every rank draws the same permutation of the corpus for an epoch (`torch.randperm` on a generator seeded with
seed + epoch), takes its own strided share of it (as `DistributedSampler` does: rank r gets positions r, r + W, ...)
and drops the tail that does not fill a whole global batch. A resumed run skips the batches its checkpoint had
already trained on in that epoch, so it continues with exactly the batches the uninterrupted run would have seen.
The sampler runs in the main process, so dataloader workers never influence the order.

Two optional reorderings keep that contract (they are functions of the same generator, so of (seed, epoch) only):
- length grouping: the epoch's examples are sorted by length within windows of `LENGTH_GROUP_BATCHES` global
  batches, cut into global batches and the batches shuffled, so a batch pads to a similar length (less padding);
- distinct batches: an example whose key (its first sentence) already occurs in its global batch is swapped with the
  next later example of the epoch whose key does not: a duplicate sentence would be a false negative for InfoNCE.
  Duplicates remain only when the rest of the epoch cannot supply a distinct one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Sampler


@dataclass(frozen=True)
class DataPosition:
    """Where training stands in the data: `batches_done` batches of epoch `epoch` have been trained on."""

    epoch: int = 0
    batches_done: int = 0


#: Indices handed to the loader per conversion from the epoch's tensor.
ITERATION_CHUNK = 1 << 16
#: Length grouping sorts within windows of this many global batches (as Hugging Face's length-grouped sampler).
LENGTH_GROUP_BATCHES = 50


class EpochSampler(Sampler[int]):
    """`lengths` (per example) turns on length grouping, `keys` (per example, equal = duplicate) distinct batches."""

    def __init__(self, num_examples: int, per_device_batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, resume_at: DataPosition | None = None,
                 lengths: Sequence[int] | None = None, keys: Sequence[int] | None = None):
        self.num_examples = num_examples
        self.per_device_batch_size = per_device_batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.resume_at = resume_at or DataPosition()
        self.epoch = self.resume_at.epoch
        self.lengths = None if lengths is None else torch.as_tensor(lengths, dtype=torch.long)
        self.keys = None if keys is None else keys.tolist() if hasattr(keys, "tolist") else list(keys)
        for name, values in (("lengths", lengths), ("keys", keys)):
            if values is not None and len(values) != num_examples:
                raise ValueError(f"{name} has {len(values)} entries for {num_examples} examples")

    @property
    def batches_per_epoch(self) -> int:
        return self.num_examples // (self.per_device_batch_size * self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch."""
        self.epoch = epoch

    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's indices for `epoch`, whole batches only, from the first batch of the epoch."""
        return self.epoch_indices(epoch).tolist()

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        """`epoch_order` as a tensor (8 bytes an index, where a list of Python ints takes about 36)."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        permutation = torch.randperm(self.num_examples, generator=generator)
        global_batch = self.per_device_batch_size * self.world_size
        used = self.batches_per_epoch * global_batch
        if self.lengths is not None:
            permutation[:used] = self._group_by_length(permutation[:used], global_batch, generator)
        if self.keys is not None:
            order = permutation.tolist()
            self._spread_duplicates(order, global_batch, used)
            permutation = torch.tensor(order, dtype=torch.long)
        return permutation[:used][self.rank::self.world_size]

    def _group_by_length(self, order: torch.Tensor, global_batch: int, generator: torch.Generator) -> torch.Tensor:
        window = global_batch * LENGTH_GROUP_BATCHES
        parts = []
        for start in range(0, len(order), window):
            part = order[start : start + window]
            parts.append(part[torch.argsort(self.lengths[part], descending=True, stable=True)])
        batches = torch.cat(parts).view(-1, global_batch)
        return batches[torch.randperm(len(batches), generator=generator)].flatten()

    def _spread_duplicates(self, order: list[int], global_batch: int, used: int) -> None:
        keys = self.keys
        for start in range(0, used, global_batch):
            end = start + global_batch
            seen: set = set()
            for position in range(start, end):
                if keys[order[position]] in seen:
                    swap = next((q for q in range(end, len(order)) if keys[order[q]] not in seen), None)
                    if swap is not None:
                        order[position], order[swap] = order[swap], order[position]
                seen.add(keys[order[position]])

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_indices(self.epoch)
        if self.epoch == self.resume_at.epoch:
            order = order[self.resume_at.batches_done * self.per_device_batch_size:]
        for chunk in order.split(ITERATION_CHUNK):  # the epoch is never one list of Python ints
            yield from chunk.tolist()

    def __len__(self) -> int:
        """The full epoch (Lightning's batch count and progress bar); a resumed epoch yields only its rest."""
        return self.batches_per_epoch * self.per_device_batch_size
