"""Saves the W&B run id with every checkpoint, so `ckpt_path=...` resumes the same W&B run.

The id goes to `checkpoint["wandb"]` (read back by `wandb_run_id` below BEFORE the logger is
created: W&B needs the id at `wandb.init`, which is earlier than Lightning restores callback states).
"""

from __future__ import annotations

import pytorch_lightning as pl
from pytorch_lightning.loggers import WandbLogger

CHECKPOINT_KEY = "wandb"  # checkpoint["wandb"] = {"run_id": ..., "project": ...}


class WandbRunCallback(pl.Callback):
    def on_save_checkpoint(self, trainer, module, checkpoint: dict) -> None:
        if not trainer.is_global_zero:  # rank 0 writes the checkpoint file
            return
        for logger in trainer.loggers:
            run = logger.experiment if isinstance(logger, WandbLogger) else None
            if run is not None and not getattr(run, "disabled", False) and getattr(run, "id", None):
                checkpoint[CHECKPOINT_KEY] = {"run_id": run.id, "project": getattr(run, "project", None),
                                              "name": getattr(run, "name", None)}
                return

def wandb_run_id(checkpoint: dict) -> str | None:
    """The W&B run id saved in a checkpoint dict by WandbRunCallback (None when it has none)."""
    return (checkpoint.get(CHECKPOINT_KEY) or {}).get("run_id")
