"""What every fault-injection test asserts about the process that met the fault: its exit status, one last line
starting with `error:`, no traceback, the files that must stay as they were (byte for byte), nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

from tests.conftest import REPO


def run_entry(script: str, *overrides: str, data_root: Path | str | None = None, env_extra: dict | None = None,
              cwd: Path = REPO, prefix: str = "", timeout: int = 600) -> subprocess.CompletedProcess:
    """`python SCRIPT overrides...` as a user runs it (`prefix`: shell words before it, such as `ulimit -f 2048;`)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("PROMPTEMB_DATA", None)
    if data_root is not None:
        env["PROMPTEMB_DATA"] = str(data_root)
    env.update(env_extra or {})
    command = [sys.executable, str(REPO / script), *overrides]
    if prefix:
        command = ["bash", "-c", prefix + ' exec "$@"', "bash", *command]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)




def listing(path: Path) -> list[str]:
    """Every entry under `path`, hidden ones included: what a fault must not add to (temporary files, orphans)."""
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob("*"))


class RunOutOfMemory(pl.Callback):
    """Test-only callback (+callbacks.oom._target_=tests.faults.RunOutOfMemory): at `step`, a real CPU allocation
    failure (an exabyte tensor) or, for `kind: cuda`, the error CUDA's allocator raises."""

    def __init__(self, step: int = 1, kind: str = "cpu"):
        self.step, self.kind = step, kind

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        if self.kind == "cuda":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                         "of 79.19 GiB of which 1.21 GiB is free.")
        torch.empty(1 << 60, dtype=torch.uint8)
