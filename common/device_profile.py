"""Every choice that depends on where a run trains or scores, made in one place: the device profile.

* AdamW (when the config names no implementation): torch's default on a CPU; fused on CUDA (one kernel per step),
  foreach under `16-mixed` with clipping;
* gradient clipping: `torch.nn.utils.clip_grad_norm_` on the optimiser's parameters (bf16-mixed has no GradScaler:
  nothing to unscale); under `16-mixed`, Lightning's plugin after the GradScaler unscaled;
* TF32 matmuls: on for training on CUDA, off while scoring (`exact_matmuls`);
* precision: as configured (`trainer=cpu`: 32-true; `trainer=gpu`: bf16-mixed);
* evaluation forwards: float32 with IEEE matmuls on every device (bf16 autocast only when asked:
  `backbone.autocast=bf16`), so scores do not depend on the device;
* DataLoader workers / pinned memory (`auto`): 0 / off on a CPU, 4 persistent / on on an accelerator;
* torch.compile: `trainer.compile`, recorded.

Why fused AdamW keeps clipping: Lightning's mixed-precision plugin refuses `clip_gradients` for an optimiser that
unscales inside its step (fused AdamW), because under fp16 the GradScaler must unscale before clipping. bf16-mixed has
no GradScaler, so the gradients are already true gradients and clipping them directly is exactly what the plugin does
at 32-true. Under `16-mixed` with clipping the profile picks the foreach implementation instead, so Lightning unscales
first (a config that forces `fused` there is refused in one line: `check_clipping`).

Rehearsal: with `PROMPTEMB_REHEARSE_CUDA=1` in the environment, a CUDA command (`train.py ... trainer=gpu`) runs on
the CPU with the CUDA profile: Lightning gets `accelerator=cpu` (one device), every other choice is the CUDA one
(fused AdamW, bf16-mixed, TF32 flags, loader workers and pinned memory; pinning itself needs a GPU, so torch skips it
with a warning). bench/gpu_validation.py --rehearse and the CPU tests run the GPU commands this way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from promptemb.common.errors import ConfigError

#: The environment variable that rehearses the CUDA profile on the CPU (see the module docstring).
REHEARSE_CUDA = "PROMPTEMB_REHEARSE_CUDA"
#: Loader workers per process on an accelerator when `num_workers: auto` (0 on a CPU trainer, whose cores the model
#: needs).
ACCELERATOR_WORKERS = 4
#: Precisions whose gradients carry a GradScaler's scale (it must unscale them before clipping).
SCALED_PRECISIONS = ("16-mixed", "16", 16)
CUDA_ACCELERATORS = ("gpu", "cuda")


def rehearsing_cuda() -> bool:
    """Whether CUDA commands run on the CPU with the CUDA profile (`PROMPTEMB_REHEARSE_CUDA=1`)."""
    return os.environ.get(REHEARSE_CUDA, "") not in ("", "0")


def cuda_device_count() -> int:
    """CUDA devices a run may ask for: this machine's, or one while rehearsing on the CPU."""
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return 1 if rehearsing_cuda() else 0


def accelerator_kind(accelerator: str | None) -> str:
    """The device type a Lightning accelerator setting trains on: cuda, cpu, mps, ..."""
    name = str(accelerator or "auto").lower()
    if name in CUDA_ACCELERATORS:
        return "cuda"
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def is_adamw(factory: Callable) -> bool:
    return getattr(factory, "func", factory) is torch.optim.AdamW


def chosen_implementation(factory: Callable | dict) -> str | None:
    """`fused` or `foreach` when the optimiser's config (a partial, or its config node) chose one, else None."""
    keywords = factory if isinstance(factory, dict) else getattr(factory, "keywords", {}) or {}
    return next((name for name in ("fused", "foreach") if keywords.get(name)), None)


def check_clipping(precision: Any, clip_value: Any, optimizer: Callable | dict) -> None:
    """An optimiser that cannot clip under this precision, refused in one line: a fused optimiser unscales fp16
    gradients inside its step, after clipping would have run on scaled ones."""
    if clip_value and str(precision) in map(str, SCALED_PRECISIONS) and chosen_implementation(optimizer) == "fused":
        raise ConfigError(f"optimizer.fused=true unscales the gradients inside its step, but trainer.precision="
                          f"{precision} clips them before it (trainer.gradient_clip_val={clip_value}): drop "
                          "optimizer.fused (foreach AdamW is used) or train with trainer.precision=bf16-mixed")


@dataclass(frozen=True)
class DeviceProfile:
    """The choices of one run: `kind` is the device type they are made for (cuda, cpu, mps), `precision` Lightning's
    precision setting, `clipping` whether gradients are clipped, `compile` whether the backbone is compiled,
    `rehearsal` whether a CUDA profile runs on the CPU."""

    kind: str
    precision: str = "32-true"
    clipping: bool = False
    compile: bool = False
    rehearsal: bool = False

    @classmethod
    def for_trainer_settings(cls, accelerator: str | None, precision: Any, clipping: bool = False,
                             compile: bool = False) -> DeviceProfile:
        kind = accelerator_kind(accelerator)
        rehearsal = kind == "cuda" and not torch.cuda.is_available() and rehearsing_cuda()
        return cls(kind, str(precision), bool(clipping), bool(compile), rehearsal)

    @classmethod
    def for_device(cls, device: torch.device, precision: Any = "32-true") -> DeviceProfile:
        return cls(torch.device(device).type, str(precision))

    # -- what Lightning gets ------------------------------------------------------------------------------------

    def lightning_settings(self, settings: dict) -> dict:
        """pytorch_lightning.Trainer's keyword arguments: as configured, or, when rehearsing, the CPU (one device)
        with the CUDA run's precision. Lightning turns `16-mixed` on a CPU accelerator into `bf16-mixed` (no
        GradScaler, with a warning); the rehearsal hands it the plugin a CUDA run gets instead (fp16 autocast and a
        GradScaler, on the CPU's device type), so the scaled-gradient path is what runs."""
        if not self.rehearsal:
            return settings
        devices = settings.get("devices", "auto")
        rehearsed = {**settings, "accelerator": "cpu", "devices": devices if isinstance(devices, int) and devices >= 1
                     else 1}
        if self.scaled_gradients:
            from pytorch_lightning.plugins.precision import MixedPrecision

            rehearsed.pop("precision")
            plugins = settings.get("plugins") or []
            rehearsed["plugins"] = [*(plugins if isinstance(plugins, list | tuple) else [plugins]),
                                    MixedPrecision("16-mixed", "cpu")]
        return rehearsed

    # -- optimiser and clipping ---------------------------------------------------------------------------------

    @property
    def scaled_gradients(self) -> bool:
        return self.precision in map(str, SCALED_PRECISIONS)

    def optimizer_options(self, factory: Callable) -> dict:
        """Extra keyword arguments for the optimiser factory: AdamW's implementation on CUDA when the config chose
        none (fused; foreach when a GradScaler must unscale before clipping)."""
        if self.kind != "cuda" or not is_adamw(factory) or chosen_implementation(factory):
            return {}
        if self.scaled_gradients and self.clipping:
            return {"foreach": True}
        return {"fused": True}

    def optimizer_implementation(self, factory: Callable) -> str:
        """What the optimiser runs as (for provenance): fused, foreach or torch's default."""
        return chosen_implementation(factory) or next(iter(self.optimizer_options(factory)), "default")

    # -- precision of matmuls --------------------------------------------------------------------------------------

    @property
    def tf32(self) -> bool:
        """TF32 matmuls in training (CUDA only: fp32 parameters and bf16-mixed's fp32 parts run on tensor cores)."""
        return self.kind == "cuda"

    def apply_training_matmul_precision(self) -> bool:
        """Turn TF32 on for training when the profile says so; whether it did."""
        if self.tf32:
            set_matmul_precision("tf32")
        return self.tf32

    # -- data loading ---------------------------------------------------------------------------------------------

    @property
    def on_accelerator(self) -> bool:
        return self.kind != "cpu"

    def loader_workers(self, setting: int | str) -> int:
        return (ACCELERATOR_WORKERS if self.on_accelerator else 0) if setting == "auto" else int(setting)

    def pin_memory(self, setting: bool | str) -> bool:
        """Pinned host memory needs a CUDA device (a rehearsal asks for it and torch skips it with a warning)."""
        wanted = self.on_accelerator if setting == "auto" else bool(setting)
        return wanted and (torch.cuda.is_available() or self.rehearsal)

    # -- provenance -----------------------------------------------------------------------------------------------

    def describe(self, factory: Callable | None = None) -> dict:
        record = {"kind": self.kind, "precision": self.precision, "tf32_training": self.tf32,
                  "evaluation": "float32, TF32 off unless backbone.autocast=bf16", "compile": self.compile,
                  "rehearsal_on_cpu": self.rehearsal}
        if factory is not None:
            record["optimizer_implementation"] = self.optimizer_implementation(factory)
        return record


def profile_of(trainer: Any) -> DeviceProfile:
    """The profile a trainer runs with: training/trainer.Trainer's own, or (a plain pytorch_lightning.Trainer) the
    one of its root device."""
    profile = getattr(trainer, "device_profile", None)
    if isinstance(profile, DeviceProfile):
        return profile
    return DeviceProfile.for_device(trainer.strategy.root_device, getattr(trainer, "precision", "32-true"))


# -- TF32 switches ------------------------------------------------------------------------------------------------
#
# torch >= 2.9 keeps two views of the same switches: the legacy flags (`torch.get_float32_matmul_precision()`,
# `torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`) and the `fp32_precision` strings. Each
# legacy getter raises ("you have used mix of the legacy and new APIs") once a new-API write left the two views
# disagreeing, and libraries read the legacy view on CUDA only: Lightning's CUDA accelerator at every fit
# (`_check_cuda_matmul_precision`), inductor's caches and conv templates. So the project writes through the legacy
# setters, which update both views together (docs/training.md, "The CUDA surface"), and writes the new API only to
# put back what a caller had set through it.


def _legacy_views() -> dict[str, Callable[[], Any]]:
    """The legacy getters, by name."""
    return {"float32_matmul_precision": torch.get_float32_matmul_precision,
            "cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32}


def _fp32_precision_switches() -> dict[str, Any]:
    """The objects that carry an `fp32_precision` string (torch >= 2.9; none before), by name: CUDA matmuls, cuDNN
    convolutions and RNNs, oneDNN's CPU matmuls and convolutions (`bf16` there multiplies float32 in bf16)."""
    backends = torch.backends
    owners = {"cuda.matmul": backends.cuda.matmul, "cudnn.conv": getattr(backends.cudnn, "conv", None),
              "cudnn.rnn": getattr(backends.cudnn, "rnn", None),
              "mkldnn.matmul": getattr(backends.mkldnn, "matmul", None),
              "mkldnn.conv": getattr(backends.mkldnn, "conv", None)}
    return {name: owner for name, owner in owners.items() if _has_fp32_precision(owner)}


def _has_fp32_precision(owner: Any) -> bool:
    try:
        return owner is not None and isinstance(owner.fp32_precision, str)
    except (AttributeError, RuntimeError):
        return False


def precision_views() -> dict[str, Any]:
    """Every getter of both APIs: its value, or `raises` where torch refuses to answer (the mixed state)."""
    views = {}
    for name, getter in _legacy_views().items():
        try:
            views[name] = getter()
        except RuntimeError:
            views[name] = "raises"
    views.update({f"{name}.fp32_precision": owner.fp32_precision for name, owner in _fp32_precision_switches().items()})
    return views


def set_matmul_precision(mode: str) -> None:
    """`tf32` or `ieee` for CUDA matmuls and cuDNN convolutions, process-wide, through the legacy setters, so both
    APIs' getters answer (`tf32`: `high`/True/True; `ieee`: `highest`/False/False). oneDNN's CPU switches are left
    as they are."""
    if mode not in ("tf32", "ieee"):
        raise ValueError(f"matmul precision {mode!r}: expected 'tf32' or 'ieee'")
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"


def matmul_precision() -> str:
    """`tf32` when CUDA matmuls may use TF32, else `ieee` (read through the legacy getter, which raises in the mixed
    state)."""
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


@contextlib.contextmanager
def preserved_matmul_precision() -> Iterator[None]:
    """Whatever the block sets, every precision getter of both APIs answers after it what it answered before."""
    saved_legacy = {name: value for name, value in precision_views().items()
                    if name in _legacy_views() and value != "raises"}
    saved_switches = {name: owner.fp32_precision for name, owner in _fp32_precision_switches().items()}
    try:
        yield
    finally:
        _restore(saved_legacy, saved_switches)


@contextlib.contextmanager
def exact_matmuls() -> Iterator[None]:
    """IEEE float32 matmuls and convolutions inside the block, whatever training or the process set (CUDA's TF32
    off, oneDNN's reduced fp32 precision off), every getter of both APIs answering (`highest`/False/False); what was
    there restored after, getter for getter."""
    with preserved_matmul_precision():
        torch.set_float32_matmul_precision("highest")  # CUDA's and oneDNN's matmuls, both views
        torch.backends.cudnn.allow_tf32 = False
        conv = _fp32_precision_switches().get("mkldnn.conv")
        if conv is not None:
            conv.fp32_precision = "ieee"
        yield


def _restore(legacy: dict[str, Any], switches: dict[str, str]) -> None:
    """The legacy flags first (each write sets both views), then each `fp32_precision` string, which then agrees
    with its flag: a state where every getter answered comes back with every getter answering the same. A caller's
    mixed state (a legacy getter raised on entry) comes back as its `fp32_precision` strings."""
    if "float32_matmul_precision" in legacy:
        torch.set_float32_matmul_precision(legacy["float32_matmul_precision"])
    if "cuda.matmul.allow_tf32" in legacy:
        torch.backends.cuda.matmul.allow_tf32 = legacy["cuda.matmul.allow_tf32"]
    if "cudnn.allow_tf32" in legacy:
        torch.backends.cudnn.allow_tf32 = legacy["cudnn.allow_tf32"]
    owners = _fp32_precision_switches()
    for name, value in switches.items():
        if owners[name].fp32_precision != value:
            owners[name].fp32_precision = value
