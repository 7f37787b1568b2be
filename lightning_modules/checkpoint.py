"""Rebuild a trained module from a Lightning checkpoint of this framework (export, `inference.load_encoder`).

The checkpoint is read with `torch.load(weights_only=True)` (train.py saves plain containers only); the recipe it
records (lightning_modules/recipe.py) rebuilds the module. Every failure is one-line UserError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.checksums import sha256_file
from promptemb.lightning_modules.recipe import RECORD_KEY, recipe_of_checkpoint

#: where a training run's lineage (training/lineage.py: corpus, settings, base weights) is recorded in its checkpoints
LINEAGE_KEY = "promptemb_lineage"

@dataclass
class LoadedCheckpoint:
    module: torch.nn.Module  # in eval mode, on CPU
    path: Path
    sha256: str
    recipe: str  # the registered name of the recipe that wrote it
    global_step: int | None


def load_memory_mapped(path: Path) -> dict:
    """torch.load with the tensors memory-mapped: reading the header (step, W&B id, hyper-parameters) does not read
    the weights; they are paged in only when used."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
        return torch.load(path, map_location="cpu", weights_only=True)


def read_checkpoint(path: str | Path, argument: str = "ckpt_path") -> dict:
    """The checkpoint dict; one-line errors for a missing, unreadable or non-promptemb file (`argument`: the
    option that named it, for the message)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist; pass {argument}=PATH of a .ckpt saved by train.py")
    try:
        checkpoint = load_memory_mapped(path)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for damaged files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"checkpoint {path} is corrupt or not a PyTorch checkpoint ({reason[:160]})") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict) or not isinstance(
        checkpoint.get("hyper_parameters"), dict
    ) or "model_name_or_path" not in checkpoint["hyper_parameters"]:
        raise DataError(
            f"checkpoint {path} is not a promptemb training checkpoint (no state_dict / hyper_parameters with "
            "model_name_or_path); pass a .ckpt written by train.py"
        )
    return checkpoint


def load_module_checkpoint(path: str | Path, base_model: str | None = None) -> LoadedCheckpoint:
    """Rebuild the module of a train.py checkpoint with its trained weights (eval mode, CPU): the recipe it records,
    looked up among the registered ones, rebuilds itself (`load_checkpoint`)."""
    path = Path(path)
    checkpoint = read_checkpoint(path)
    cls = recipe_of_checkpoint(checkpoint, path)
    module = cls.load_checkpoint(path, checkpoint, base_model)
    return LoadedCheckpoint(module=module, path=path, sha256=sha256_file(path, cached=False),
                            recipe=checkpoint[RECORD_KEY]["name"], global_step=checkpoint.get("global_step"))


def recorded_arguments(checkpoint: dict, base_model: str | None = None) -> dict:
    """The constructor arguments the checkpoint's module was built with; `base_model` replaces a base model that has
    moved."""
    arguments = dict(checkpoint[RECORD_KEY].get("arguments") or {})
    if base_model:
        arguments["model_name_or_path"] = base_model
    return arguments


def rebuild_with_weights(cls: type, path: Path, checkpoint: dict, base_model: str | None = None) -> torch.nn.Module:
    """`cls` called with the constructor arguments the checkpoint records (which load the base model's config and
    tokenizer from `model_name_or_path`, or from `base_model`), the trained weights loaded strictly."""
    arguments = recorded_arguments(checkpoint, base_model)
    try:
        module = cls(**arguments)
    except TypeError as err:
        raise DataError(f"checkpoint {path}: its recorded arguments do not fit {cls.__name__} ({err})") from None
    try:
        result = module.load_state_dict(checkpoint["state_dict"], strict=False)
    except RuntimeError as err:  # shape mismatches
        raise DataError(f"checkpoint {path} does not match {cls.__name__} built from "
                        f"{arguments.get('model_name_or_path')!r} ({str(err).splitlines()[0][:160]}); pass "
                        "base_model= the model it was trained from") from None
    if result.missing_keys or result.unexpected_keys:
        problem = result.missing_keys[:1] or result.unexpected_keys[:1]
        raise DataError(
            f"checkpoint {path} does not match {cls.__name__} built from {arguments.get('model_name_or_path')!r} "
            f"({len(result.missing_keys)} missing, {len(result.unexpected_keys)} unexpected weights, e.g. "
            f"{problem[0]}); pass base_model= the model it was trained from"
        )
    return module.eval()
