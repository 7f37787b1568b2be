"""train.py's ModelCheckpoint: relocatable run folders, nothing saved from a non-finite state, a checkpoint on SIGTERM.

* Paths in its checkpointed state are stored relative to the checkpoint folder, so a run folder that was moved or
  copied resumes with its best-checkpoint bookkeeping intact (Lightning's ModelCheckpoint stores absolute paths
  and drops its best score when the folder differs).
* Before every save the weights are checked: non-finite weights stop the run (`DivergenceError`) and the last good
  checkpoint stays as it was. Loggers are flushed first, so metrics.csv on disk covers every step a checkpoint does.
* On SIGTERM (preemption) it saves `last.ckpt` at the next batch boundary and asks the trainer to stop there
  (Lightning then raises its SIGTERMException, which train.py turns into a one-line `PreemptedError` saying how to
  resume); with the datamodule's position and the RNG state in the checkpoint, the resumed run is exact.
"""

from __future__ import annotations

import os

import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from promptemb.common.errors import DivergenceError

PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


def non_finite_parameter(module: torch.nn.Module) -> str | None:
    """Name of the first parameter holding a NaN/inf, or None."""
    for name, parameter in module.named_parameters():
        if parameter.is_floating_point() and not torch.isfinite(parameter).all():
            return name
    return None


class RunCheckpoint(ModelCheckpoint):
    def state_dict(self) -> dict:
        state = super().state_dict()
        relative = {key: self._relative(state.get(key)) for key in PATH_KEYS}
        best_k = {self._relative(path): score for path, score in state.get("best_k_models", {}).items()}
        return {**state, **relative, "best_k_models": best_k, "dirpath": "."}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("dirpath") == "." and self.dirpath:
            absolute = {key: self._absolute(state_dict.get(key)) for key in PATH_KEYS}
            best_k = {self._absolute(path): score for path, score in state_dict.get("best_k_models", {}).items()}
            state_dict = {**state_dict, **absolute, "best_k_models": best_k, "dirpath": self.dirpath}
        super().load_state_dict(state_dict)

    def _relative(self, path: str | None) -> str | None:
        return os.path.relpath(path, self.dirpath) if path and self.dirpath else path

    def _absolute(self, path: str | None) -> str | None:
        return os.path.normpath(os.path.join(self.dirpath, path)) if path else path

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        bad = non_finite_parameter(trainer.lightning_module)
        if bad is not None:
            last = self.last_model_path or "none yet"
            raise DivergenceError(
                f"weights are not finite at step {trainer.global_step} ({bad}); stopped without saving, the last good "
                f"checkpoint is {last}; lower optimizer.lr or clip gradients (trainer.gradient_clip_val=1.0)")
        for logger in trainer.loggers:
            logger.save()
        super()._save_checkpoint(trainer, filepath)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # every rank takes part (saving is collective under DDP), whichever rank the signal reached
        if trainer.strategy.reduce_boolean_decision(bool(trainer.received_sigterm), all=False):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            trainer.should_stop = True  # the step's own logging still happens, then the loop ends
