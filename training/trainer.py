"""The Lightning Trainer train.py builds (configs/trainer/): pytorch_lightning.Trainer plus the device profile.

* `device_profile` (common/device_profile.py): every device-dependent choice of the run (AdamW implementation,
  clipping, TF32 in training, loader workers, pinned memory, evaluation precision), decided once from the trainer's
  accelerator, precision, clipping and compile settings; a CUDA command rehearsed on the CPU
  (`PROMPTEMB_REHEARSE_CUDA=1`) gets the CUDA profile and Lightning's CPU accelerator;
* `compile: true`: the transformer call of the module's training step compiled with torch.compile when fit starts
  (the recipe's `compile_training_forward`: static shapes on inputs padded to a few widths, so a bounded number of
  graphs; evaluation stays eager; parameter names, checkpoints and exports unchanged). The first steps that meet
  each width pay its compilation; refused before any work where it cannot run (`check_compile`, and the decoder
  recipe's own `check_compile`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import pytorch_lightning as pl
from annotated_types import Ge

from promptemb.common.bounds import AtLeastOne, NonNegative
from promptemb.common.compilation import check_compile_works
from promptemb.common.device_profile import DeviceProfile
from promptemb.common.validation import declare_hints


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
        planned = DeviceProfile.for_trainer_settings(kwargs.get("accelerator"), kwargs.get("precision"))
        kwargs = planned.lightning_settings(kwargs)
        if compile:
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), CompileBackbone()]
        super().__init__(*args, **kwargs)
        # made again from what Lightning resolved (`auto` accelerator and precision)
        profile = DeviceProfile(planned.kind if planned.rehearsal else self.strategy.root_device.type,
                                str(self.precision), clipping=bool(self.gradient_clip_val), compile=compile,
                                rehearsal=planned.rehearsal)
        self.device_profile = profile
        self.tf32 = profile.apply_training_matmul_precision()


#: Lightning's own hints say `int` or `str`; these are the values it accepts (`gpu`/`cuda`/`mps` are checked against
#: this machine too).
declare_hints(Trainer, accelerator=Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu", "hpu"],
              max_steps=Annotated[int, Ge(-1)], max_epochs=Annotated[int, Ge(-1)] | None,
              log_every_n_steps=AtLeastOne | None, gradient_clip_val=NonNegative | None,
              accumulate_grad_batches=AtLeastOne)
