"""The Lightning Trainer train.py builds (configs/trainer/): pytorch_lightning.Trainer plus the GPU-path settings.

* TF32 matmuls and convolutions whenever the trainer runs on CUDA (fp32 parameters and bf16-mixed's fp32 parts run
  on tensor cores; the mantissa lost is far below bf16's);
* `compile: true`: the backbone (`module.transformer`) compiled in place with torch.compile when fit starts
  (nn.Module.compile keeps parameter names, so checkpoints and exports are unchanged). The first steps pay the
  compilation; refused before any work where it cannot run (`check_compile`).
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from promptemb.common.compilation import check_compile_works


def enable_tf32(device: torch.device) -> bool:
    """TF32 on for CUDA matmuls and cuDNN convolutions when `device` is a CUDA device; whether it was turned on."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def check_compile(compile: bool, accelerator: str | None) -> None:
    if compile:
        check_compile_works("trainer.compile", accelerator)


class CompileBackbone(pl.Callback):
    """torch.compile of the module's transformer, in place, before the first step."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        pl_module.transformer.compile()


class Trainer(pl.Trainer):
    def __init__(self, *args, compile: bool = False, **kwargs):
        """`compile`: torch.compile the backbone (see the module docstring); every other argument is
        pytorch_lightning.Trainer's."""
        if compile:
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), CompileBackbone()]
        super().__init__(*args, **kwargs)
        self.tf32 = enable_tf32(self.strategy.root_device)
