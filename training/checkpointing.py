"""train.py's ModelCheckpoint: relocatable run folders, nothing saved from a non-finite state, a checkpoint on SIGTERM.

* Paths in its checkpointed state are stored relative to the checkpoint folder, so a run folder that was moved or
  copied resumes with its best-checkpoint bookkeeping intact (Lightning's ModelCheckpoint stores absolute paths
  and drops its best score when the folder differs).
* Before every save the weights are checked: non-finite weights stop the run (`DivergenceError`) and the last good
  checkpoint stays as it was. Loggers are flushed first, so metrics.csv on disk covers every step a checkpoint does.
* On SIGTERM (preemption) it saves `last.ckpt` at the next batch boundary and asks the trainer to stop there
  (Lightning then raises its SIGTERMException, which train.py turns into a one-line `PreemptedError` saying how to
  resume); with the datamodule's position and the RNG state in the checkpoint, the resumed run is exact.
* Only `last.ckpt` keeps what resuming needs beyond the weights: the best checkpoints (what scoring and export read)
  are written without the optimizer state, a third of the size with AdamW (bert-base: ~0.44 GB instead of ~1.3 GB);
  resuming from one is refused in one line that names the run's `last.ckpt` (`check_resumable`).
* Every checkpoint is written to a temporary file next to its target and renamed over it (`AtomicCheckpointIO`):
  Lightning's own writer stages the file in `$TMPDIR`, so with `$TMPDIR` on another filesystem its final move is a
  copy and a kill during it leaves a truncated `last.ckpt`. Temporary files of a process that died mid-write are
  removed when the next run on the folder starts; a write that fails (disk full, file size limit) is one line and
  leaves the checkpoints written before as they were.
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import tempfile
from pathlib import Path

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import ModelCheckpoint

from promptemb.common.bounds import AtLeastOne
from promptemb.common.errors import ConfigError, DivergenceError, UserError
from promptemb.common.io import fsync_directory, umask_mode
from promptemb.common.validation import declare_hints

log = logging.getLogger(__name__)

PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")
#: what only resuming reads: left out of the best checkpoints
RESUME_ONLY_KEYS = ("optimizer_states",)


def non_finite_parameter(module: torch.nn.Module) -> str | None:
    """Name of the first parameter holding a NaN/inf, or None."""
    for name, parameter in module.named_parameters():
        if parameter.is_floating_point() and not torch.isfinite(parameter).all():
            return name
    return None


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (disk full, file size limit, permissions); nothing earlier was touched."""


#: `.NAME.HOST.PID.RANDOM.partial`: whose write it is, so a later run can tell an orphan from a live write.
PARTIAL_SUFFIX = ".partial"
PARTIAL_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[^.]+" + re.escape(PARTIAL_SUFFIX) + "$")


def partial_prefix(target: Path) -> str:
    return f".{target.name}.{socket.gethostname().split('.')[0]}.{os.getpid()}."


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into a temporary file in the target's folder, fsync, then `os.replace` onto the target: on any
    filesystem layout a reader (or a resumed run) finds the previous complete file or the new complete file.
    While `without_resume_state` is set (by `RunCheckpoint`, for a best checkpoint) the optimizer state is left out."""

    without_resume_state = False

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if self.without_resume_state:
            checkpoint = {key: value for key, value in checkpoint.items() if key not in RESUME_ONLY_KEYS}
        if "://" in str(path):  # remote storage: fsspec's transaction is its atomic write
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        buffer = io.BytesIO()  # serialised first, so a failed write is an OSError, not torch's RuntimeError
        torch.save(checkpoint, buffer)
        tmp = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=partial_prefix(target), suffix=PARTIAL_SUFFIX, dir=target.parent)
            tmp = Path(name)
            with os.fdopen(fd, "wb") as file:
                file.write(buffer.getbuffer())
                file.flush()
                os.fsync(file.fileno())
            tmp.chmod(umask_mode())
            os.replace(tmp, target)
            fsync_directory(target.parent)
        except OSError as err:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            kept = sorted(p.name for p in target.parent.glob("*.ckpt")) if target.parent.is_dir() else []
            raise CheckpointWriteError(
                f"could not write checkpoint {target}: {err.strerror or err}; the checkpoints written before are "
                f"intact ({', '.join(kept) or 'none yet'}); free disk space (or raise the file size limit) and resume "
                "with ckpt_path=last") from None
        except BaseException:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            raise


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_orphaned_partials(folder: Path) -> list[Path]:
    """Temporary checkpoint files of processes on this host that are gone (killed mid-write); returns them, removed.
    Another host's files are left: whether its writer lives cannot be told from here."""
    host = socket.gethostname().split(".")[0]
    removed = []
    for path in sorted(Path(folder).glob(f".*{PARTIAL_SUFFIX}")) if Path(folder).is_dir() else []:
        match = PARTIAL_NAME.match(path.name)
        if match and match["host"] == host and not process_alive(int(match["pid"])):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class RunCheckpoint(ModelCheckpoint):
    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # exactly Lightning's default writer: another one (an async or remote plugin) was chosen on purpose
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if trainer.is_global_zero and self.dirpath:
            removed = remove_orphaned_partials(Path(self.dirpath))
            if removed:
                log.warning("removed %d partial checkpoint file(s) left by a process killed while writing: %s",
                            len(removed), ", ".join(p.name for p in removed))

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
        writer = trainer.strategy.checkpoint_io
        best = isinstance(writer, AtomicCheckpointIO) and not Path(filepath).name.startswith(self.CHECKPOINT_NAME_LAST)
        writer_state = getattr(writer, "without_resume_state", False)
        if best:
            writer.without_resume_state = True
        try:
            super()._save_checkpoint(trainer, filepath)
        finally:
            if best:
                writer.without_resume_state = writer_state

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # every rank takes part (saving is collective under DDP), whichever rank the signal reached
        if trainer.strategy.reduce_boolean_decision(bool(trainer.received_sigterm), all=False):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            trainer.should_stop = True  # the step's own logging still happens, then the loop ends


declare_hints(RunCheckpoint, every_n_train_steps=AtLeastOne | None)


def check_resumable(path: Path, checkpoint: dict) -> None:
    """A checkpoint written without the optimizer state (a run's best checkpoint) cannot resume training exactly."""
    if "optimizer_states" not in checkpoint:
        raise ConfigError(f"cannot resume from {path}: it holds the weights without the optimizer state (a run's best "
                          f"checkpoint keeps what scoring and export need); resume from "
                          f"{path.parent / ModelCheckpoint.CHECKPOINT_NAME_LAST}.ckpt (ckpt_path=last)")
