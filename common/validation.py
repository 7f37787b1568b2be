"""The generic checker of composed configs: type hints, ranges and choices by parameter name, files, folders and
devices. The owners of each config group use it: training/config_checks.py (train.py), evaluation/config_checks.py
(evaluate.py), encoder/settings.py (the backbone).

Types come from where the values go: every config node with a `_target_` is checked against the type hints of that
class's constructor (following `**kwargs` up the class hierarchy; a factory's flat keys against the settings
dataclasses it declares), the `backbone` node against `Encoder`'s, the remaining top-level keys against the
dataclasses below. Ranges and choices are declared once per parameter name
(`RANGES`, `CHOICES`) and apply wherever that name occurs. Then what only the machine and the file system can refute:
devices, readable inputs, writable outputs, complete model weights, the columns of a supervised data file.

Every failure is one `ConfigError` / `DataError` line naming the key, the value and what is valid. A run that fails
here leaves nothing behind: the run folder Hydra created for it (holding only Hydra's own files) is removed.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from omegaconf import DictConfig, OmegaConf

from promptemb.common.errors import ConfigError
from promptemb.common.instantiate import KEYWORD_SETTINGS
from promptemb.configs import CONFIG_DIR

# -- declared once per parameter name --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """A finite value with low <= value (or low < value when `open_low`) and value <= high."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):  # NaN compares false with every bound; inf is no usable setting either
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.open_low else '>='} {self.low}")
        if self.high is not None:
            parts.append(f"<= {self.high}")
        return " and ".join(parts)


POSITIVE, NON_NEGATIVE = Range(0, open_low=True), Range(0)
AT_LEAST_ONE = Range(1)
#: Valid ranges by parameter name, wherever the name occurs (model, optimizer, scheduler, data, trainer, callbacks,
#: evaluate.py).
RANGES: dict[str, Range] = {
    "batch_size": AT_LEAST_ONE,
    "lr": POSITIVE,
    "temperature": POSITIVE,
    "weight_decay": NON_NEGATIVE,
    "warmup_ratio": Range(0, 1),
    "max_sentence_tokens": AT_LEAST_ONE,
    "max_length": Range(3),  # [CLS] + at least one token + [SEP]
    "num_workers": NON_NEGATIVE,
    "max_examples": AT_LEAST_ONE,
    "every_n_steps": AT_LEAST_ONE,
    "eval_every_n_steps": AT_LEAST_ONE,
    "every_n_train_steps": AT_LEAST_ONE,
    "max_steps": Range(-1),
    "max_epochs": Range(-1),
    "log_every_n_steps": AT_LEAST_ONE,
    "gradient_clip_val": NON_NEGATIVE,
    "accumulate_grad_batches": AT_LEAST_ONE,
    "seed": Range(0, 2**32 - 1),
}

#: Hardware accelerators Lightning knows; `gpu`/`cuda` and `mps` are also checked against this machine.
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu", "hpu")


#: Valid values by parameter name, registered by the modules that own them (`register_choices`).
CHOICES: dict[str, tuple[str, ...]] = {"accelerator": ACCELERATORS}


def register_choices(name: str, values) -> None:
    """Declare the valid values of a parameter name wherever it occurs (the owner registers at import)."""
    CHOICES[name] = tuple(values)


# -- the keys that no constructor receives -----------------------------------------------------------------------


@dataclass
class TemplateSettings:
    """A `template` group option (configs/template/): one template, or a pair of training views."""

    text: str | None
    second_text: str | None
    sentence_rule: str


# -- types -----------------------------------------------------------------------------------------------------------


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def matches(value: Any, hint) -> bool:
    """Whether a plain config value (after OmegaConf.to_container) fits a type hint. Classes a YAML value cannot be
    (Accelerator, Strategy, timedelta, ...) are left to the constructor."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    if hint is None or hint is type(None):
        return value is None
    if _is_union(hint):
        if isinstance(value, str | int | float | bool):  # a scalar is no Tensor, Strategy, ...: only YAML-typed arms
            typed = [arg for arg in args if not (isinstance(arg, type) and not _yaml_type(arg))]
            args = typed or args
        return any(matches(value, arg) for arg in args)
    if origin is typing.Annotated:
        return matches(value, args[0])
    if origin is Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            return False
        item = args[0] if args else Any
        return all(matches(element, item) for element in value)
    if hint is dict or origin in (dict, Mapping):
        return isinstance(value, dict)
    if hint is Path or (isinstance(hint, type) and issubclass(hint, Path)):
        return isinstance(value, str)
    return True


def describe(hint) -> str:
    """A type hint in words: `an integer`, `a number`, `one of 16-mixed, 32-true`, `null or an integer`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "null"
    if _is_union(hint):
        literals = [value for arg in args if typing.get_origin(arg) is Literal for value in typing.get_args(arg)]
        literals = list({str(value): value for value in literals}.values())  # 16 and "16" read the same
        words = [describe(Literal[tuple(literals)])] if literals else []
        words += [describe(arg) for arg in args if typing.get_origin(arg) is not Literal
                  and not (isinstance(arg, type) and not _yaml_type(arg))]
        words = [w for w in dict.fromkeys(words) if w and not (w == "an integer" and "a number" in words)]
        return " or ".join(sorted(words, key=lambda w: w != "null"))
    if origin is typing.Annotated:
        return describe(args[0])
    if origin is Literal:
        return "one of " + ", ".join(str(arg) for arg in args)
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        return f"a list of {_plural(describe(args[0]))}" if args else "a list"
    if hint is dict or origin in (dict, Mapping):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, "a path"
                                                                                             if hint is Path else "")


def _plural(word: str) -> str:
    return {"an integer": "integers", "a number": "numbers", "a string": "strings"}.get(word, word)


def _yaml_type(cls: type) -> bool:
    return cls in (bool, int, float, str, list, tuple, dict, type(None)) or issubclass(cls, Path)


def constructor_hints(cls: type) -> tuple[dict[str, Any], bool]:
    """(parameter -> type hint, accepts unknown keywords) of `cls(...)`, following `**kwargs` to the base classes."""
    hints: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            resolved = typing.get_type_hints(init, include_extras=True)
            parameters = inspect.signature(init).parameters
        except (TypeError, ValueError, NameError):  # a C or unannotatable constructor: nothing to check against
            return hints, True
        for name, parameter in parameters.items():
            if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            hints.setdefault(name, resolved.get(name, Any))
        if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
            return hints, False
    return hints, True


def function_hints(fn) -> tuple[dict[str, Any], bool]:
    """(parameter -> type hint, accepts unknown keywords) of a function; a factory whose `**keywords` are the fields
    of settings dataclasses (`common.instantiate.keywords_of`) takes exactly those fields, typed as declared."""
    try:
        resolved = typing.get_type_hints(fn, include_extras=True)
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError, NameError):
        return {}, True
    hints = {name: resolved.get(name, Any) for name, p in parameters.items()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    settings = getattr(fn, KEYWORD_SETTINGS, ())
    for kind in settings:
        fields = typing.get_type_hints(kind, include_extras=True)
        hints.update({field.name: fields.get(field.name, Any) for field in dataclasses.fields(kind)})
    return hints, not settings and any(p.kind == p.VAR_KEYWORD for p in parameters.values())


def target_name(obj) -> str:
    """How a `_target_` is named in messages: a classmethod factory by its class."""
    owner = getattr(obj, "__self__", None)
    return owner.__name__ if inspect.isclass(owner) else obj.__name__


def check_value(key: str, value: Any, hint=Any) -> None:
    """One key: its type (from `hint`), then its range or choices (by the key's last name)."""
    shown = f"{key}={value!r}"
    name = key.rsplit(".", 1)[-1]
    if not matches(value, hint):
        wanted = describe(hint) or "another type"
        if name in RANGES and RANGES[name].describe():
            wanted += f" {RANGES[name].describe()}"
        raise ConfigError(f"{shown} is not valid: {name} must be {wanted}")
    if value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and not math.isfinite(value):  # NaN compares false with every bound, so no range would catch it
        raise ConfigError(f"{shown} is not valid: {name} must be a finite number (not nan or inf)")
    if name in RANGES and number and not RANGES[name].contains(value):
        kind = "a number" if matches(0.5, hint) else "an integer"
        raise ConfigError(f"{shown} is out of range: {name} must be {kind} {RANGES[name].describe()}")
    choices = CHOICES.get(name)
    if choices and isinstance(value, str) and value not in choices:
        raise ConfigError(f"{shown} is not valid: {name} must be one of {', '.join(choices)}")


def check_node(prefix: str, node: dict, hints: dict[str, Any], open_keywords: bool, owner: str) -> None:
    for name, value in node.items():
        if name.startswith("_") and name.endswith("_"):  # _target_, _convert_, _partial_, ...
            continue
        key = f"{prefix}{name}"
        if name not in hints and not open_keywords:
            raise ConfigError(f"{key} is not a parameter of {owner}; valid: {', '.join(sorted(hints))}")
        check_value(key, value, hints.get(name, Any))


def check_targets(node: Any, prefix: str = "") -> None:
    """Every `_target_` node in the tree against its class's constructor."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str):
            from hydra.utils import get_object

            try:
                obj = get_object(target)
            except Exception:  # not importable: Hydra reports it when instantiating
                obj = None
            if inspect.isclass(obj):
                hints, open_keywords = constructor_hints(obj)
                check_node(prefix, node, hints, open_keywords, obj.__name__)
            elif callable(obj):  # a function target (a learning-rate schedule, a classmethod factory)
                hints, open_keywords = function_hints(obj)
                check_node(prefix, node, hints, open_keywords, target_name(obj))
        for name, value in node.items():
            check_targets(value, f"{prefix}{name}.")


def check_settings(container: dict, settings: type) -> None:
    hints = typing.get_type_hints(settings)
    for field in dataclasses.fields(settings):
        if field.name in container:
            check_value(field.name, container[field.name], hints[field.name])


def resolved(cfg: DictConfig) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as err:  # an interpolation that does not resolve
        raise ConfigError(f"the config does not resolve: {str(err).splitlines()[0]}") from None


def template_options(pairs: bool) -> list[str]:
    """Names of configs/template/ options that are pairs of views (`pairs`) or single templates."""
    names = []
    for path in sorted((CONFIG_DIR / "template").glob("*.yaml")):
        option = OmegaConf.load(path)
        if option.get("text") is not None and (option.get("second_text") is not None) == pairs:
            names.append(path.stem)
    return names


def check_template(container: dict, recipe: str | None) -> None:
    """The `template` node against what uses it: a training recipe (`recipe`: the LightningModule's `_target_`) takes
    as many templates as it has views; evaluate.py (`recipe` None) takes one template or none."""
    template = container.get("template") or {}
    check_node("template.", template, typing.get_type_hints(TemplateSettings), False, "a template option")
    given = [name for name in ("text", "second_text") if template.get(name) is not None]
    if recipe is None:
        if "second_text" in given:
            raise ConfigError("template.second_text is set (a pair of training views) but evaluate.py scores one "
                              "template: use a single template (template=" + "|".join(template_options(False)) +
                              ") or template.second_text=null")
        return
    from hydra.utils import get_class

    try:
        views = getattr(get_class(recipe), "template_views", None)
    except Exception:  # not importable: Hydra reports it when instantiating
        return
    if views is None or (len(given) == views and "text" in given):
        return
    name = recipe.rsplit(".", 1)[-1]
    wanted = ("a pair of templates (template.text, template.second_text)" if views == 2
              else "one template (template.text)")
    got = {0: "no template", 1: "one template", 2: "a pair of templates"}[len(given)]
    raise ConfigError(f"{name} trains with {wanted} but the template config gives {got}; valid here: template="
                      + "|".join(template_options(views == 2)))


# -- the machine and the file system -----------------------------------------------------------------------------


def check_accelerator(key: str, accelerator: Any, devices: Any = None) -> None:
    """`gpu`/`cuda`/`mps` only where this machine has one; a device count no larger than what it has."""
    import torch

    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={accelerator} but this machine has no CUDA GPU (torch.cuda.is_available() is "
                              "False); use trainer.accelerator=cpu or auto")
        count = torch.cuda.device_count()
        wanted = len(devices) if isinstance(devices, list) else devices
        if isinstance(wanted, int) and wanted > count:
            raise ConfigError(f"trainer.devices={devices} but this machine has {count} CUDA GPU(s)")
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}=mps but this machine has no Apple MPS device; use cpu or auto")


def check_device(key: str, device: str) -> None:
    """evaluate.py's `backbone.device`: auto, cpu, cuda, cuda:N, mps, ... and present on this machine."""
    import torch

    if device == "auto":
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{key}={device!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}={device} but this machine has no CUDA GPU (torch.cuda.is_available() is "
                              "False); use backbone.device=cpu or auto")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ConfigError(f"{key}={device} but this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}=mps but this machine has no Apple MPS device; use cpu or auto")


def check_readable_file(key: str, path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: {'not a file' if path.exists() else 'no such file'}")
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as err:
        raise ConfigError(f"{key}={str(path)!r} is not readable ({err.strerror})") from None
    return path


def check_writable_dir(key: str, path: str | Path) -> None:
    """`path` is, or can be created as, a directory we can write to; probed with a temporary file that is removed at
    once (permission bits say nothing for root or read-only file systems), so nothing is created."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}={str(path)!r} is not writable: it exists and is not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key}={str(path)!r} cannot be created: {existing} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ConfigError(f"{key}={str(path)!r} is not writable ({existing}: {err.strerror})") from None





