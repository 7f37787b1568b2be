"""Rebuild a trained module from a Lightning checkpoint of this framework (export, `inference.load_encoder`).

The checkpoint is read with `torch.load(weights_only=True)` (train.py saves plain containers only), the module class
comes from the `promptemb_module` record (older checkpoints: inferred from their state-dict keys), the module is
rebuilt from `hyper_parameters` (which loads the base model's config and tokenizer from `model_name_or_path`, or from
`base_model` when that has moved) and the trained weights are loaded strictly. Every failure is one-line UserError.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.checksums import sha256_file

MODULE_CLASSES = {
    "promptemb.lightning_modules.promptbert.PromptBERTUnsup",
    "promptemb.lightning_modules.promptbert.PromptBERTSup",
    "promptemb.lightning_modules.optiprompt.OptiPrompt",
    "promptemb.lightning_modules.prompteol.PromptEOLSup",
    "promptemb.lightning_modules.angle_recipe.AnglE",
    "promptemb.lightning_modules.dcpcse.DCPCSE",
    "promptemb.lightning_modules.llm2vec.LLM2VecMNTP",
    "promptemb.lightning_modules.llm2vec.LLM2VecContrastive",
}
#: Recipes whose checkpoints hold only a LoRA adapter: rebuilt by their own loader, which checks the base model.
ADAPTER_CLASSES = {
    "promptemb.lightning_modules.prompteol.PromptEOLSup":
        "promptemb.lightning_modules.prompteol.load_adapter_checkpoint",
    "promptemb.lightning_modules.llm2vec.LLM2VecMNTP": "promptemb.lightning_modules.llm2vec.load_adapter_checkpoint",
    "promptemb.lightning_modules.llm2vec.LLM2VecContrastive":
        "promptemb.lightning_modules.llm2vec.load_adapter_checkpoint",
}
#: where a training run's lineage (training/lineage.py: corpus, settings, base weights) is recorded in its checkpoints
LINEAGE_KEY = "promptemb_lineage"
#: state-dict prefixes of weights older checkpoints carry but the modules no longer keep
#: (PromptBERTSup held the whole *ForMaskedLM model as `mlm_model`, duplicating `transformer.*`)
LEGACY_PREFIXES = ("mlm_model.",)
#: Hyper-parameters of older checkpoints that configured the optimiser and schedule, now `optimizer`/`scheduler`.
LEGACY_OPTIMIZER_HPARAMS = ("lr", "weight_decay", "warmup_ratio")


@dataclass
class LoadedCheckpoint:
    module: torch.nn.Module  # in eval mode, on CPU
    path: Path
    sha256: str
    class_path: str
    global_step: int | None


def load_memory_mapped(path: Path) -> dict:
    """torch.load with the tensors memory-mapped: reading the header (step, W&B id, hyper-parameters) does not read
    the weights; they are paged in only when used."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
        return torch.load(path, map_location="cpu", weights_only=True)


def read_checkpoint(path: str | Path, argument: str = "ckpt") -> dict:
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


def module_class_path(checkpoint: dict) -> str:
    recorded = checkpoint.get("promptemb_module")
    if recorded and not recorded.startswith("promptemb."):  # written before the one-namespace package
        recorded = f"promptemb.{recorded}"
    if recorded:
        if recorded not in MODULE_CLASSES:
            known = ", ".join(sorted(MODULE_CLASSES))
            raise DataError(f"checkpoint module class {recorded!r} is unknown; known: {known}")
        return recorded
    keys = checkpoint["state_dict"].keys()
    if any(key.startswith("soft_template.") for key in keys):
        return "promptemb.lightning_modules.optiprompt.OptiPrompt"
    if any(key.startswith("head.") for key in keys):
        return "promptemb.lightning_modules.promptbert.PromptBERTSup"
    if any(key.startswith("mlp.") for key in keys):
        return "promptemb.lightning_modules.promptbert.PromptBERTUnsup"
    raise DataError("cannot tell which module wrote this checkpoint (no soft_template/head/mlp weights)")


def load_module_checkpoint(path: str | Path, base_model: str | None = None) -> LoadedCheckpoint:
    """Rebuild the module of a train.py checkpoint with its trained weights (eval mode, CPU)."""
    path = Path(path)
    checkpoint = read_checkpoint(path)
    class_path = module_class_path(checkpoint)
    if class_path in ADAPTER_CLASSES:  # the LoRA recipe: its loader puts the adapter on the recorded base model
        loader_module, loader_name = ADAPTER_CLASSES[class_path].rsplit(".", 1)
        module = getattr(importlib.import_module(loader_module), loader_name)(path, base_model)
        return LoadedCheckpoint(module=module, path=path, sha256=sha256_file(path, cached=False),
                                class_path=class_path, global_step=checkpoint.get("global_step"))
    module_name, class_name = class_path.rsplit(".", 1)
    module_cls = getattr(importlib.import_module(module_name), class_name)
    hparams = dict(checkpoint["hyper_parameters"])
    if base_model:
        hparams["model_name_or_path"] = base_model
    for key in LEGACY_OPTIMIZER_HPARAMS:  # older checkpoints: these only configured the optimiser and schedule
        hparams.pop(key, None)
    if class_path.endswith("OptiPrompt") and "templates" in hparams:
        hparams["template"] = hparams.pop("templates")[0]
    try:
        module = module_cls(**hparams)
    except TypeError as err:
        raise DataError(f"checkpoint {path}: its hyper_parameters do not fit {class_name} ({err})") from None
    state = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith(LEGACY_PREFIXES)}
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches
        raise DataError(f"checkpoint {path} does not match {class_name} built from "
                        f"{hparams['model_name_or_path']!r} ({str(err).splitlines()[0][:160]}); pass base_model= "
                        "the model it was trained from") from None
    if result.missing_keys or result.unexpected_keys:
        problem = result.missing_keys[:1] or result.unexpected_keys[:1]
        raise DataError(
            f"checkpoint {path} does not match {class_name} built from {hparams['model_name_or_path']!r} "
            f"({len(result.missing_keys)} missing, {len(result.unexpected_keys)} unexpected weights, e.g. "
            f"{problem[0]}); pass base_model= the model it was trained from"
        )
    module.eval()
    return LoadedCheckpoint(module=module, path=path, sha256=sha256_file(path, cached=False), class_path=class_path,
                            global_step=checkpoint.get("global_step"))
