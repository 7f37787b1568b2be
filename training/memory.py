"""Out of memory during training, on the CPU or a GPU: one line naming the settings that use less memory per step,
instead of a torch traceback (the run is then recorded as failed like any other one-line error)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from promptemb.common.errors import UserError


class TrainingOutOfMemoryError(UserError):
    """A training step needed more memory than the device (or the machine) has."""


#: How allocators word it: CUDA ("CUDA out of memory"), the CPU allocator ("DefaultCPUAllocator: can't allocate
#: memory"), MPS ("MPS backend out of memory"), and a loader worker ended by the kernel's out-of-memory killer.
MARKERS = ("out of memory", "can't allocate memory", "not enough memory", "is killed by signal: Killed")


def is_out_of_memory(err: BaseException) -> bool:
    if isinstance(err, MemoryError):
        return True
    return isinstance(err, RuntimeError) and any(marker in str(err) for marker in MARKERS)


def out_of_memory_message(err: BaseException, trainer) -> str:
    """The settings that use less memory per step, as the fitted recipe and datamodule hold them now."""
    what = (str(err).strip().splitlines() or [type(err).__name__])[0]
    what = what if len(what) <= 160 else what[:157] + "..."
    hparams, batch = trainer.lightning_module.hparams, trainer.datamodule.batch_size
    return (f"out of memory at step {trainer.global_step} ({what}); use less memory per step: a smaller "
            f"data.batch_size (now {batch}), model.grad_cache_chunk_size=N to embed each batch in chunks of N "
            f"examples (now {hparams.grad_cache_chunk_size}), or model.gradient_checkpointing=true (now "
            f"{str(hparams.gradient_checkpointing).lower()})")


@contextlib.contextmanager
def out_of_memory_is_one_line(trainer) -> Iterator[None]:
    """Inside: an out-of-memory error of `trainer.fit` becomes a one-line `TrainingOutOfMemoryError`."""
    try:
        yield
    except (RuntimeError, MemoryError) as err:
        if not is_out_of_memory(err):
            raise
        raise TrainingOutOfMemoryError(out_of_memory_message(err, trainer)) from None
