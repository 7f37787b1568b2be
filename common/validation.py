"""The generic checker of composed configs. Each command's settings validator calls it (training/settings.py,
evaluation/settings.py, exporting/settings.py, encoder/settings.py); the owners declare what is valid in their own
type hints: every `_target_` node is checked against its constructor's or function's hints (following `**kwargs` up
the class hierarchy; a factory's flat keys against its settings dataclasses), other keys against their settings
model's fields. pydantic checks each value in strict mode, bounds (`Annotated[int, Ge(1)]`, common/bounds.py) and
choices (`Literal[...]`) included; a class we do not own gets its hints from the module that configures it
(`declare_hints`). Then what only the machine and the file system can refute: devices, readable inputs, writable
outputs. Every failure is one `ConfigError` line naming the key, the value and what is valid."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from annotated_types import Interval, Predicate
from hydra.utils import get_object
from pydantic import BaseModel, ConfigDict, FiniteFloat, TypeAdapter, ValidationError

from promptemb.common.errors import ConfigError
from promptemb.common.instantiate import KEYWORD_SETTINGS

# -- bounds and choices: written in the owners' type hints -------------------------------------------------------


class Range(Interval):
    """Bounds of a parameter (annotated-types' `Interval`: gt, ge, le), enforced by pydantic on a finite number."""

    __slots__ = ()

    def describe(self) -> str:
        bounds = (("> ", self.gt), (">= ", self.ge), ("< ", self.lt), ("<= ", self.le))
        return " and ".join(f"{sign}{bound}" for sign, bound in bounds if bound is not None)


def bounds_of(hint) -> Range:
    """The annotated-types bounds in a hint (`Annotated[int, Ge(1)]`, also as an arm of a union); none: Range()."""
    found = {}
    for arm in typing.get_args(hint) if _is_union(hint) else (hint,):
        if typing.get_origin(arm) is Annotated:
            for constraint in arm.__metadata__:
                for bound in constraint if isinstance(constraint, Interval) else (constraint,):
                    found.update({side: getattr(bound, side) for side in ("gt", "ge", "lt", "le")
                                  if getattr(bound, side, None) is not None})
    return Range(**found)


#: Hints for parameters of classes we do not own (Lightning's Trainer, torch's AdamW), declared by the module that
#: configures them; they replace the class's own hints for those parameters.
DECLARED_HINTS: dict[Any, dict[str, Any]] = {}


def declare_hints(owner, **hints) -> None:
    DECLARED_HINTS.setdefault(owner, {}).update(hints)


def settings_hints(settings: type[BaseModel]) -> dict[str, Any]:
    """A settings model's fields with their hints as written (bounds included: pydantic moves them off
    `field.annotation`)."""
    hints = typing.get_type_hints(settings, include_extras=True)
    return {name: hints[name] for name in settings.model_fields}


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
    if hint is dict or origin in (dict, Mapping) or settings_group(hint) is not None:  # a group: its keys, one by one
        return dict
    if isinstance(hint, type) and issubclass(hint, Path):
        return str
    return hint if hint in (bool, int, float, str, None, type(None)) else Any


@functools.cache
def _adapter(hint) -> TypeAdapter:
    return TypeAdapter(hint)


def matches(value: Any, hint) -> bool:
    """Whether a plain config value fits a type hint, in pydantic's strict mode."""
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
    if hint is dict or origin in (dict, Mapping) or settings_group(hint) is not None:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", None: "null",
            type(None): "null", Path: "a path"}.get(hint, "")


def _plural(word: str) -> str:
    return {"an integer": "integers", "a number": "numbers", "a string": "strings"}.get(word, word)


def parameter_hints(target) -> tuple[dict[str, Any], bool]:
    """(parameter -> type hint, accepts unknown keywords) of a function or of `cls(...)`, following `**kwargs` to the
    base classes; a factory whose `**keywords` are the fields of settings dataclasses (`common.instantiate.keywords_of`)
    takes exactly those fields, typed as declared; `declare_hints` overrides come last."""
    hints: dict[str, Any] = {}
    open_keywords = True
    owners = target.__mro__ if inspect.isclass(target) else (target,)
    functions = [owner.__dict__.get("__init__") for owner in owners] if inspect.isclass(target) else [target]
    for function in filter(None, functions):
        try:
            resolved = typing.get_type_hints(function, include_extras=True)
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError, NameError):  # a C or unannotatable constructor: nothing to check against
            break
        for name, parameter in parameters.items():
            if name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                hints.setdefault(name, resolved.get(name, Any))
        settings = getattr(function, KEYWORD_SETTINGS, ())
        for kind in settings:
            fields = typing.get_type_hints(kind, include_extras=True)
            hints.update({field.name: fields.get(field.name, Any) for field in dataclasses.fields(kind)})
        if settings or not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
            open_keywords = False
            break
    for owner in reversed(owners):
        hints.update(DECLARED_HINTS.get(owner, {}))
    return hints, open_keywords


def target_name(obj) -> str:
    """How a `_target_` is named in messages: a classmethod factory by its class."""
    owner = getattr(obj, "__self__", None)
    return owner.__name__ if inspect.isclass(owner) else obj.__name__


def check_value(key: str, value: Any, hint=Any) -> None:
    """One key against its type hint: the type, then the bounds or choices the hint carries (`Annotated[int, Ge(1)]`,
    `Literal[...]`), and any number finite; pydantic's verdicts in one line each."""
    shown, name, bounds = f"{key}={value!r}", key.rsplit(".", 1)[-1], bounds_of(hint)
    if not matches(value, hint):
        wanted = " ".join(filter(None, (describe(hint) or "another type", bounds.describe())))
        raise ConfigError(f"{shown} is not valid: {name} must be {wanted}")
    error = _range_error(bounds, value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if error == "finite_number":  # NaN compares false with every bound, inf is no usable setting either
        raise ConfigError(f"{shown} is not valid: {name} must be a finite number (not nan or inf)")
    if error:
        kind = "a number" if matches(0.5, hint) else "an integer"
        raise ConfigError(f"{shown} is out of range: {name} must be {kind} {bounds.describe()}")


def check_node(prefix: str, node: dict, hints: dict[str, Any], open_keywords: bool, owner: str) -> None:
    for name, value in node.items():
        if name.startswith("_") and name.endswith("_"):  # _target_, _convert_, _partial_, ...
            continue
        key = f"{prefix}{name}"
        if name not in hints and not open_keywords:
            raise not_a_key(key, hints, owner, "a parameter")
        check_value(key, value, hints.get(name, Any))


def import_target(path: Any) -> Any:
    """The class or function a `_target_` path names; None when it is none, or cannot be imported (Hydra reports
    that when instantiating)."""
    if isinstance(path, str):
        with contextlib.suppress(Exception):
            return get_object(path)
    return None


def target_of(node: dict) -> Any:
    """What a config node's `_target_` names (`import_target`)."""
    return import_target(node.get("_target_"))


def target_nodes(node: Any, prefix: str = "") -> list[tuple[str, dict, Any]]:
    """(key prefix, node, imported target) of every `_target_` node in the tree."""
    found = []
    if isinstance(node, dict):
        if (target := target_of(node)) is not None:
            found.append((prefix, node, target))
        for name, value in node.items():
            found += target_nodes(value, f"{prefix}{name}.")
    return found


def check_node_maps(container: dict, *keys: str) -> None:
    """`callbacks`, `logger`: a `_target_` node, or a map of them (or null); any other entry would be built as a plain
    value, so it is a key the map does not have."""
    for key in keys:
        nodes = container.get(key) or {}
        if "_target_" in nodes:
            continue
        valid = [name for name, node in nodes.items() if isinstance(node, dict) and "_target_" in node]
        for name, node in nodes.items():
            if node is not None and name not in valid:
                raise not_a_key(f"{key}.{name}", valid, f"{key} (a map of `_target_` nodes)")


def check_targets(node: Any) -> None:
    """Every `_target_` node in the tree against its class's constructor or its function (a learning-rate
    schedule); all targets are imported first, so each module's `declare_hints` is in place."""
    for prefix, values, obj in target_nodes(node):
        if callable(obj):  # a class, a function (a learning-rate schedule) or a classmethod factory
            check_node(prefix, values, *parameter_hints(obj), target_name(obj))


def closest(name: str, names) -> str | None:
    """The valid name closest to `name` ("did you mean"), None when none is close."""
    return next(iter(difflib.get_close_matches(name, sorted(map(str, names)), n=1, cutoff=0.6)), None)


class UnknownKeyError(ConfigError):
    """A key its config, group or constructor does not have: wrong in every job of a sweep alike."""


def not_a_key(key: str, names, owner: str, noun: str = "a key") -> UnknownKeyError:
    """The one line for a key `owner` does not have, naming the closest valid one (else the valid ones)."""
    parent, _, leaf = key.rpartition(".")
    guess = closest(leaf, names)
    fix = f"did you mean {parent}{'.' * bool(parent)}{guess}?" if guess else f"valid: {', '.join(sorted(names))}"
    return UnknownKeyError(f"{key} is not {noun} of {owner}; {fix}")


#: `model_validate(values, context=COMPOSITION)`: the composition alone (types, keys, what the values say about each
#: other), without what only the machine and the file system can refute (a multirun's command line previews a job).
COMPOSITION = "composition"


class Settings(BaseModel):
    """A command's settings or a config group's: a key it does not declare is refused (pydantic's `extra="forbid"`),
    and `model_validate` answers a pydantic error with one `ConfigError` line naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    described_as: ClassVar[str] = "the config"

    @classmethod
    def model_validate(cls, obj: Any, **kwargs):
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as err:
            raise refusal(err, cls) from None


def refusal(err: ValidationError, settings: type[BaseModel]) -> ConfigError:
    """pydantic's first error as one line: an unknown key with the closest valid one, else `key=value: msg`."""
    error = next((e for e in err.errors() if e["type"] == "extra_forbidden"), err.errors()[0])
    key = ".".join(map(str, error["loc"]))
    if error["type"] == "missing":
        return ConfigError(f"{key}: {error['msg']}")
    if error["type"] != "extra_forbidden":
        return ConfigError(f"{key}={error['input']!r}: {error['msg']}")
    owner = settings
    for part in error["loc"][:-1]:  # the settings model (group) the key was given in
        hint = owner.model_fields[part].annotation
        owner = next(arm for arm in (hint, *typing.get_args(hint)) if settings_group(arm) is not None)
    return not_a_key(key, [name for name in owner.model_fields if name != "resolved"], owner.described_as)


def settings_group(hint) -> type[BaseModel] | None:
    """The settings model a field's hint is (`TemplateSettings`, `Extras`): a config group checked key by key; None
    for any other hint."""
    return hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None


def check_settings(container: dict, settings: type[BaseModel]) -> None:
    """Each key of `container` against its field of `settings`; a field that is itself a settings model (a config
    group such as `template`) key by key, where a key it does not have is refused."""
    for name, hint in settings_hints(settings).items():
        if name not in container:
            continue
        if (group := settings_group(hint)) is not None and isinstance(container[name], dict):
            check_node(f"{name}.", container[name], settings_hints(group), False, group.described_as)
        else:
            check_value(name, container[name], hint)


# -- the machine and the file system -----------------------------------------------------------------------------


def check_on_this_machine(key: str, value: Any, kind: str, fix: str, needed: int | None = None,
                          needed_by: str = "") -> None:
    """A `gpu`/`cuda`/`mps` setting only where this machine has one (and at least `needed` CUDA GPUs)."""
    import torch

    if kind in ("gpu", "cuda"):
        from promptemb.common.device_profile import cuda_device_count

        available = cuda_device_count()  # one while a CUDA command is rehearsed on the CPU
        if not available:
            raise ConfigError(f"{key}={value} but this machine has no CUDA GPU (torch.cuda.is_available() is "
                              f"False); use {fix}")
        if needed is not None and needed > available:
            raise ConfigError(f"{needed_by} but this machine has {available} CUDA GPU(s)")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}=mps but this machine has no Apple MPS device; use cpu or auto")


def check_accelerator(key: str, accelerator: Any, devices: Any = None) -> None:
    """The trainer's accelerator, and no more devices than this machine has."""
    wanted = len(devices) if isinstance(devices, list) else devices
    check_on_this_machine(key, accelerator, str(accelerator), "trainer.accelerator=cpu or auto",
                          wanted if isinstance(wanted, int) else None, f"trainer.devices={devices}")


def check_device(key: str, device: str) -> None:
    """evaluate.py's `backbone.device`: auto, cpu, cuda, cuda:N, mps, ... and present on this machine."""
    import torch

    if device == "auto":
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{key}={device!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    check_on_this_machine(key, device, parsed.type, "backbone.device=cpu or auto",
                          None if parsed.index is None else parsed.index + 1, f"{key}={device}")


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
