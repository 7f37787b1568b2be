"""Optional dependencies (the package's extras): imported only where a run uses them, with a one-line hint when one
is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from promptemb.common.errors import ConfigError

#: module -> (pip package, extra of promptemb that installs it)
EXTRAS = {
    "wandb": ("wandb", "wandb"),
    "sentence_transformers": ("sentence-transformers", "export"),
    "matplotlib": ("matplotlib", "plots"),
    "optuna": ("optuna", "sweeps"),
    "peft": ("peft", "decoders"),
    "mteb": ("mteb", "mteb"),
}


def install_hint(module: str) -> str:
    package, extra = EXTRAS[module]
    return f"pip install 'promptemb[{extra}]' (or pip install {package})"


def require(module: str, purpose: str) -> ModuleType:
    """`module`, imported; a ConfigError naming what needs it and how to install it when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{purpose} needs the optional package {EXTRAS[module][0]}: {install_hint(module)}") from None


def available(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
