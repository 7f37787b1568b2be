"""The training progress bar, with a total and ETA that end where the run ends (`max_steps`), not at the epoch's
last batch: `max_steps=50` over a 1,135-batch epoch shows 50 batches, not 1,135 and an ETA of an hour."""

from __future__ import annotations

from pytorch_lightning.callbacks import TQDMProgressBar


class StepBoundedProgressBar(TQDMProgressBar):
    @property
    def total_train_batches(self) -> int | float:
        total = super().total_train_batches
        trainer = self.trainer
        if trainer.max_steps is None or trainer.max_steps < 0 or total == float("inf"):
            return total
        done_in_epoch = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        remaining = (trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches
        return min(total, done_in_epoch + remaining)
