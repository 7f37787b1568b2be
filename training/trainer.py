"""The Lightning Trainer train.py builds (configs/trainer/): pytorch_lightning.Trainer plus the GPU-path settings.

* TF32 matmuls and convolutions whenever the trainer runs on CUDA (fp32 parameters and bf16-mixed's fp32 parts run
  on tensor cores; the mantissa lost is far below bf16's);
* `compile: true`: the backbone (`module.transformer`) compiled in place with torch.compile when fit starts
  (nn.Module.compile keeps parameter names, so checkpoints and exports are unchanged). The first steps pay the
  compilation; refused before any work where it cannot run (`check_compile`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import pytorch_lightning as pl
import torch
from annotated_types import Ge

from promptemb.common.bounds import AtLeastOne, NonNegative
from promptemb.common.compilation import check_compile_works
from promptemb.common.validation import declare_hints


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
    """torch.compile of what the module's training step runs, before the first step (the recipe's
    `compile_training_forward`: a bounded number of graphs; evaluation stays eager)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        pl_module.compile_training_forward()


class Trainer(pl.Trainer):
    def __init__(self, *args, compile: bool = False, **kwargs):
        """`compile`: torch.compile the backbone (see the module docstring); every other argument is
        pytorch_lightning.Trainer's."""
        if compile:
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), CompileBackbone()]
        super().__init__(*args, **kwargs)
        self.tf32 = enable_tf32(self.strategy.root_device)


#: Lightning's own hints say `int` or `str`; these are the values it accepts (`gpu`/`cuda`/`mps` are checked against
#: this machine too).
declare_hints(Trainer, accelerator=Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu", "hpu"],
              max_steps=Annotated[int, Ge(-1)], max_epochs=Annotated[int, Ge(-1)] | None,
              log_every_n_steps=AtLeastOne | None, gradient_clip_val=NonNegative | None,
              accumulate_grad_batches=AtLeastOne)
