"""The generic checker of composed configs: types, ranges and choices by parameter name, files, folders and devices.
The owners of each config group use it: training/config_checks.py (train.py), evaluation/config_checks.py
(evaluate.py), encoder/settings.py (the backbone).

Types come from where the values go: every config node with a `_target_` is checked against the type hints of that
class's constructor (following `**kwargs` up the class hierarchy) or function (a factory's flat keys against the
settings dataclasses it declares), the `backbone` node against `Encoder`'s,
the remaining top-level keys against their owners' pydantic settings models. pydantic checks each value against its
hint (strict mode) and against the range declared once per parameter name (`RANGES`, annotated-types intervals),
wherever the name occurs; valid values are registered by name too (`CHOICES`). Then what only the machine and the file
system can refute: devices, readable inputs, writable outputs, complete model weights, the columns of a supervised data
file.

Every failure is one `ConfigError` / `DataError` line naming the key, the value and what is valid (`check_value`
words pydantic's verdicts). A run that fails here leaves nothing behind: the run folder Hydra created for it (holding
only Hydra's own files) is removed.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from annotated_types import Interval, Predicate
from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, FiniteFloat, TypeAdapter, ValidationError

from promptemb.common.errors import ConfigError
from promptemb.common.instantiate import KEYWORD_SETTINGS
from promptemb.configs import CONFIG_DIR

# -- declared once per parameter name --------------------------------------------------------------------------------


class Range(Interval):
    """Bounds of a parameter (annotated-types' `Interval`: gt, ge, le), enforced by pydantic on a finite number."""

    __slots__ = ()

    def contains(self, value: float) -> bool:
        return _range_error(self, value) is None

    def describe(self) -> str:
        bounds = (("> ", self.gt), (">= ", self.ge), ("< ", self.lt), ("<= ", self.le))
        return " and ".join(f"{sign}{bound}" for sign, bound in bounds if bound is not None)


POSITIVE, NON_NEGATIVE, AT_LEAST_ONE = Range(gt=0), Range(ge=0), Range(ge=1)
#: Valid ranges by parameter name, wherever the name occurs (model, optimizer, scheduler, data, trainer, callbacks,
#: evaluate.py).
RANGES: dict[str, Range] = {
    "batch_size": AT_LEAST_ONE,
    "lr": POSITIVE,
    "temperature": POSITIVE,
    "weight_decay": NON_NEGATIVE,
    "warmup_ratio": Range(ge=0, le=1),
    "max_sentence_tokens": AT_LEAST_ONE,
    "max_length": Range(ge=3),  # [CLS] + at least one token + [SEP]
    "num_workers": NON_NEGATIVE,
    "parallel_batches": AT_LEAST_ONE,
    "max_examples": AT_LEAST_ONE,
    "every_n_steps": AT_LEAST_ONE,
    "eval_every_n_steps": AT_LEAST_ONE,
    "every_n_train_steps": AT_LEAST_ONE,
    "max_steps": Range(ge=-1),
    "max_epochs": Range(ge=-1),
    "log_every_n_steps": AT_LEAST_ONE,
    "gradient_clip_val": NON_NEGATIVE,
    "accumulate_grad_batches": AT_LEAST_ONE,
    "seed": Range(ge=0, le=2**32 - 1),
}

#: Hardware accelerators Lightning knows; `gpu`/`cuda` and `mps` are also checked against this machine.
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu", "hpu")


#: Valid values by parameter name, registered by the modules that own them (`register_choices`).
CHOICES: dict[str, tuple[str, ...]] = {"accelerator": ACCELERATORS}


def register_choices(name: str, values) -> None:
    """Declare the valid values of a parameter name wherever it occurs (the owner registers at import)."""
    CHOICES[name] = tuple(values)


# -- the keys that no constructor receives -----------------------------------------------------------------------


class TemplateSettings(BaseModel):
    """A `template` group option (configs/template/): one template, or a pair of training views."""

    text: str | None
    second_text: str | None
    sentence_rule: str


def settings_hints(settings: type[BaseModel]) -> dict[str, Any]:
    return {name: field.annotation for name, field in settings.model_fields.items()}


# -- types: pydantic decides, `describe` words the hint ---------------------------------------------------------------

#: What a class arm of a union (Tensor, Strategy, timedelta: no YAML value is one) accepts: anything but a scalar,
#: left to the constructor.
NOT_SCALAR = list | tuple | dict | None


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def _foreign(arm) -> bool:
    """A class that no YAML value can be."""
    return isinstance(arm, type) and not (arm in (bool, int, float, str, list, tuple, dict, type(None))
                                          or issubclass(arm, Path))


def yaml_hint(hint):
    """`hint` as a value of a composed config can meet it, for pydantic's strict mode: a sequence is a list, a path a
    string, a literal keeps its type (16.0 is not 16), a mapping's entries and what no YAML value can be (classes,
    callables) are left to the constructor, except that a scalar cannot be a class of a union that has other arms."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_union(hint):
        if all(_foreign(arm) for arm in args):
            return Any
        return Union[tuple(NOT_SCALAR if _foreign(arm) else yaml_hint(arm) for arm in args)]  # noqa: UP007
    if origin is Annotated:
        return yaml_hint(args[0])
    if origin is Literal:  # by type: pydantic's literals take 16.0 for 16 and True for 1
        kinds = {type(arg): tuple(a for a in args if type(a) is type(arg)) for arg in args}
        return Union[tuple(Annotated[kind, Predicate(v.__contains__)] for kind, v in kinds.items())]  # noqa: UP007
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        item = yaml_hint(args[0]) if args else Any
        return list[item] | tuple[item, ...]
    if hint is dict or origin in (dict, Mapping):
        return dict
    if isinstance(hint, type) and issubclass(hint, Path):
        return str
    return hint if hint in (bool, int, float, str, None, type(None)) else Any


@functools.cache
def _adapter(hint) -> TypeAdapter:
    return TypeAdapter(hint)


def matches(value: Any, hint) -> bool:
    """Whether a plain config value (after OmegaConf.to_container) fits a type hint, in pydantic's strict mode."""
    try:
        _adapter(yaml_hint(hint)).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def _range_error(bounds: Range, value: float) -> str | None:
    """pydantic's error type for a number outside `bounds` or not finite (`finite_number`), None when it is valid."""
    try:
        _adapter(Annotated[FiniteFloat, bounds]).validate_python(value)
    except ValidationError as err:
        return err.errors()[0]["type"]
    return None


def describe(hint) -> str:
    """A type hint in words: `an integer`, `a number`, `one of 16-mixed, 32-true`, `null or an integer`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_union(hint):
        literals = {str(value): value for arg in args if typing.get_origin(arg) is Literal
                    for value in typing.get_args(arg)}  # 16 and "16" read the same
        words = [describe(Literal[tuple(literals.values())])] if literals else []
        words += [describe(arg) for arg in args if typing.get_origin(arg) is not Literal and not _foreign(arg)]
        words = [w for w in dict.fromkeys(words) if w and not (w == "an integer" and "a number" in words)]
        return " or ".join(sorted(words, key=lambda w: w != "null"))
    if origin is Annotated:
        return describe(args[0])
    if origin is Literal:
        return "one of " + ", ".join(str(arg) for arg in args)
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        return f"a list of {_plural(describe(args[0]))}" if args else "a list"
    if hint is dict or origin in (dict, Mapping):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", None: "null",
            type(None): "null", Path: "a path"}.get(hint, "")


def _plural(word: str) -> str:
    return {"an integer": "integers", "a number": "numbers", "a string": "strings"}.get(word, word)


def parameter_hints(target) -> tuple[dict[str, Any], bool]:
    """(parameter -> type hint, accepts unknown keywords) of a function or of `cls(...)`, following `**kwargs` to the
    base classes; a factory whose `**keywords` are the fields of settings dataclasses (`common.instantiate.keywords_of`)
    takes exactly those fields, typed as declared."""
    hints: dict[str, Any] = {}
    functions = [klass.__dict__.get("__init__") for klass in target.__mro__] if inspect.isclass(target) else [target]
    for function in filter(None, functions):
        try:
            resolved = typing.get_type_hints(function, include_extras=True)
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError, NameError):  # a C or unannotatable constructor: nothing to check against
            return hints, True
        for name, parameter in parameters.items():
            if name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                hints.setdefault(name, resolved.get(name, Any))
        settings = getattr(function, KEYWORD_SETTINGS, ())
        for kind in settings:
            fields = typing.get_type_hints(kind, include_extras=True)
            hints.update({field.name: fields.get(field.name, Any) for field in dataclasses.fields(kind)})
        if settings or not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
            return hints, False
    return hints, True


def target_name(obj) -> str:
    """How a `_target_` is named in messages: a classmethod factory by its class."""
    owner = getattr(obj, "__self__", None)
    return owner.__name__ if inspect.isclass(owner) else obj.__name__


def check_value(key: str, value: Any, hint=Any) -> None:
    """One key: its type (from `hint`), then its range or choices (by the key's last name); pydantic's verdicts in
    one line each."""
    shown, name = f"{key}={value!r}", key.rsplit(".", 1)[-1]
    bounds = RANGES.get(name, Range())
    if not matches(value, hint):
        wanted = " ".join(filter(None, (describe(hint) or "another type", bounds.describe())))
        raise ConfigError(f"{shown} is not valid: {name} must be {wanted}")
    error = _range_error(bounds, value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if error == "finite_number":  # NaN compares false with every bound, inf is no usable setting either
        raise ConfigError(f"{shown} is not valid: {name} must be a finite number (not nan or inf)")
    if error:
        kind = "a number" if matches(0.5, hint) else "an integer"
        raise ConfigError(f"{shown} is out of range: {name} must be {kind} {bounds.describe()}")
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
    """Every `_target_` node in the tree against its class's constructor or its function (a learning-rate
    schedule)."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str):
            from hydra.utils import get_object

            try:
                obj = get_object(target)
            except Exception:  # not importable: Hydra reports it when instantiating
                obj = None
            if callable(obj):  # a class, a function (a learning-rate schedule) or a classmethod factory
                check_node(prefix, node, *parameter_hints(obj), target_name(obj))
        for name, value in node.items():
            check_targets(value, f"{prefix}{name}.")


def check_settings(container: dict, settings: type[BaseModel]) -> None:
    for name, hint in settings_hints(settings).items():
        if name in container:
            check_value(name, container[name], hint)


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
    check_node("template.", template, settings_hints(TemplateSettings), False, "a template option")
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
