"""What the rest of the framework asks of a recipe, in one place: its registered name, how its checkpoint is rebuilt,
and how it encodes at inference (what `evaluate.py`, `load_encoder`, the MTEB wrapper and an export use).

A recipe is a LightningModule class registered by name:

    @register_recipe("my_simcse")
    class MySimCSE(PromptContrastiveModule): ...

Training records the name (and the class, for the hint) in every checkpoint; loading looks the name up here and asks
the class to rebuild itself (`load_checkpoint`: full weights by default, an adapter on its recorded base for the
LoRA recipes) and to say how it encodes (`encoding_spec`). A checkpoint of a recipe that is not registered in the
process is refused with the `imports=` that would register it; nothing is imported because a checkpoint names it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Any

import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.registry import Registry, qualified_name

RECIPES = Registry("recipe", "docs/training.md", 'decorate the class with @register_recipe("NAME") in its module and '
                   "pass imports=[MODULE]")
#: where a checkpoint records the recipe that wrote it: {"name": registered name or None, "class": module.QualName}
RECORD_KEY = "promptemb_recipe"


def register_recipe(name: str):
    """Class decorator: the recipe is known by `name` to every command (`model._target_` names the class; its
    checkpoints record `name`)."""
    def register(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module) and hasattr(cls, "load_checkpoint")):
            raise TypeError(f"@register_recipe({name!r}) decorates a recipe class (a subclass of "
                            f"PromptContrastiveModule), not {cls!r}")
        return RECIPES.register(name, cls)
    return register


def recipe_name(cls: type) -> str | None:
    """The name `cls` itself is registered under (a subclass is not registered by its parent's name)."""
    return RECIPES.name_of(cls)


def require_registered(cls: type, key: str = "model._target_") -> str:
    """The registered name of the recipe class a run trains; one line when it has none (its checkpoints could not be
    scored, exported or loaded)."""
    name = recipe_name(cls)
    if name is None:
        raise ConfigError(f"{key}={qualified_name(cls)} is not a registered recipe, so its checkpoints could not be "
                          f'loaded: decorate the class with @register_recipe("a_name") (promptemb.lightning_modules.'
                          f"recipe) in {cls.__module__}")
    return name


#: constructor arguments that are not part of the model: the optimiser and schedule factories (the run's config
#: records them)
NOT_RECORDED = ("optimizer", "scheduler")


def constructor_arguments(module: torch.nn.Module) -> dict:
    """The arguments `module` was built with (`RecipeConstruction`), by parameter name, `**kwargs` spread out: calling
    the class with them rebuilds it."""
    args, kwargs = getattr(module, "_constructor_call", ((), {}))
    signature = inspect.signature(type(module).__init__)
    bound = signature.bind(module, *args, **kwargs)
    arguments = {}
    for name, value in list(bound.arguments.items())[1:]:
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            raise TypeError(f"{type(module).__name__}.__init__ takes *{name}: a recipe's arguments must have names")
        if kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        else:
            arguments[name] = value
    return {name: value for name, value in arguments.items() if name not in NOT_RECORDED}


class RecipeConstruction:
    """Mixed into the recipe base: remembers the arguments each instance is constructed with, so a checkpoint can
    record them and rebuild the module by calling its class with them again."""

    def __new__(cls, *args, **kwargs):
        module = super().__new__(cls)
        object.__setattr__(module, "_constructor_call", (args, kwargs))
        return module


def recipe_record(module: torch.nn.Module) -> dict:
    """What a checkpoint records about its recipe: the registered name, the class and its constructor arguments."""
    return {"name": recipe_name(type(module)), "class": qualified_name(type(module)),
            "arguments": constructor_arguments(module)}


def register_builtin_recipes() -> None:
    """Import every module of this package, so that each built-in recipe is registered (a checkpoint read in a fresh
    process names its recipe; the package's own modules are the only ones imported without `imports=`)."""
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{info.name}")


def recipe_of_checkpoint(checkpoint: dict, path: Any) -> type:
    """The registered class that rebuilds a checkpoint; one line for a checkpoint of an unregistered recipe."""
    register_builtin_recipes()
    record = checkpoint.get(RECORD_KEY)
    if not isinstance(record, dict) or "class" not in record:
        raise DataError(f"checkpoint {path} records no recipe; pass a .ckpt written by train.py")
    name, cls = record.get("name"), str(record["class"])
    module = cls.rpartition(".")[0]
    if name is None:
        raise DataError(f"checkpoint {path} was written by {cls}, which was not a registered recipe; decorate it "
                        f'with @register_recipe("a_name") in {module}, then retrain (the name is recorded when the '
                        "checkpoint is written)")
    if name not in RECIPES:
        raise DataError(f"checkpoint {path} was trained by recipe {name!r} ({cls}), which is not registered in this "
                        f"process: pass imports=[{module}] (the module that registers it), or install it with a "
                        "promptemb.plugins entry point")
    return RECIPES[name]


@dataclass
class EncodingSpec:
    """How a trained module encodes at inference, and what an export of it records: the transformer and tokenizer
    (an adapter recipe's merged copy when asked), the input form (template or None for a recipe that reads the plain
    sentence in its own format), one pooler and the trained parts it uses. `PromptEncoder(**spec.arguments())`
    (inference/prompt_encoder.py) encodes with it; the export writes it."""

    transformer: torch.nn.Module
    tokenizer: Any
    template: str | None
    sentence_rule: str
    pooler: str  # mask | avg | cls | last_token | llm2vec
    layer: int = -1
    denoise: bool = False
    head: torch.nn.Module | None = None
    head_after_denoise: bool = False
    which_mask: int | None = None  # pooler mask: the k-th [MASK] of the template (-1 the last); None: their mean
    soft_template: torch.nn.Module | None = None
    deep_prompt: torch.nn.Module | None = None
    max_length: int | None = None
    padding_side: str = "left"
    adapter: dict | None = None  # a kept LoRA adapter: base model name, weights sha256, folder, dtype, quantization
    llm2vec: dict | None = None  # LLM2Vec's pooling settings (a bidirectional decoder)
    source: dict = field(default_factory=dict)  # what the export records about where the model came from

    def arguments(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "source"}
