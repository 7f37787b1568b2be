"""The generic checker of composed configs: pydantic does the work, this module frames its answer in one line.

Each command's settings and each config group are `Settings` models (pydantic, strict, `extra="forbid"`). Every
`_target_` node is validated against a schema built from its constructor's or function's type hints (following
`**kwargs` up the class hierarchy; a factory's flat keys against its settings dataclasses; a class we do not own gets
its hints from the module that configures it, `declare_hints`): bounds (`Annotated[int, Ge(1)]`, common/bounds.py),
choices (`Literal[...]`) and finite numbers included, and a parameter it does not take refused. A refusal is one
`ConfigError` line in the project's frame, `key=value: pydantic's message`, or for a key nobody takes the closest
valid one ("did you mean"). Then what only the machine and the file system can refute: devices, readable inputs,
writable outputs."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import math
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NotRequired, Union

from hydra.utils import get_object
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from promptemb.common.errors import ConfigError
from promptemb.common.instantiate import KEYWORD_SETTINGS

#: Hints for parameters of classes we do not own (Lightning's Trainer, torch's AdamW), declared by the module that
#: configures them; they replace the class's own hints for those parameters.
DECLARED_HINTS: dict[Any, dict[str, Any]] = {}


def declare_hints(owner, **hints) -> None:
    DECLARED_HINTS.setdefault(owner, {}).update(hints)
    node_schema.cache_clear()  # a schema built before the declaration would not know it


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


# -- what a YAML value can be: the hint as pydantic's strict mode meets a composed config -----------------------------

#: What a class arm of a union (Tensor, Strategy, timedelta: no YAML value is one) accepts: anything but a scalar,
#: left to the constructor.
NOT_SCALAR = list | tuple | dict | None
#: pydantic's strict mode, finite numbers only, for hints that are not settings models.
STRICT = ConfigDict(strict=True, allow_inf_nan=False, arbitrary_types_allowed=True)


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def _foreign(arm) -> bool:
    """A class that no YAML value can be."""
    return isinstance(arm, type) and not (arm in (bool, int, float, str, list, tuple, dict, type(None))
                                          or issubclass(arm, Path))


def _finite(value: Any, path: str = "") -> Any:
    """No NaN or infinity at any depth, even where the hint allows anything (an open map such as `pooler_args`,
    whose keys their owners check when they build: a non-finite number would reach them unrefused)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError("finite_number", "Input should be a finite number" + " (at {path})" * bool(path),
                                  {"path": path})
    for name, item in value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ():
        _finite(item, f"{path}.{name}".lstrip("."))
    return value


#: A map whose keys are checked where it is used (`pooler_args`, ...), its numbers finite at any depth.
OpenMap = Annotated[dict, AfterValidator(_finite)]


class _NotAChoice:
    """What a value of another type than a literal's choices stands in for: no literal equals it."""


def _of_type(kinds: set[type]):
    """A literal's choices keep their type (pydantic would take 16.0 for 16 and True for 1)."""
    return BeforeValidator(lambda value: value if type(value) in kinds else _NotAChoice)


def yaml_hint(hint):
    """`hint` as a value of a composed config can meet it, for pydantic's strict mode: a sequence is a list, a path a
    string, a literal keeps its type (16.0 is not 16), bounds stay, a mapping's entries and what no YAML value can be
    (classes, callables) are left to the constructor, except that a scalar cannot be a class of a union that has
    other arms; any number finite."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_union(hint):
        if all(_foreign(arm) for arm in args):
            return Annotated[Any, BeforeValidator(_finite)]
        literal = [arm for arm in args if typing.get_origin(arm) is Literal]
        choices = tuple(choice for arm in literal for choice in typing.get_args(arm))
        arms = [NOT_SCALAR if _foreign(arm) else yaml_hint(arm) for arm in args if arm not in literal]
        return Union[tuple(arms + [yaml_hint(Literal[choices])] * bool(choices))]  # noqa: UP007 (the literals as one)
    if origin is Annotated:
        return Annotated[(yaml_hint(args[0]), *hint.__metadata__)]
    if origin is Literal:
        return Annotated[hint, _of_type({type(arg) for arg in args})]
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        return list[yaml_hint(args[0]) if args else Any]
    if hint is dict or origin in (dict, Mapping):
        return OpenMap
    if isinstance(hint, type) and issubclass(hint, Path):
        return str
    return hint if hint in (bool, int, float, str, None, type(None)) else Annotated[Any, BeforeValidator(_finite)]


@functools.cache
def _adapter(hint) -> TypeAdapter:
    return TypeAdapter(yaml_hint(hint), config=STRICT)


@functools.cache
def node_schema(target) -> TypeAdapter:
    """A `_target_` node's keys as pydantic validates them: one field per parameter of the target, typed by its hint,
    none required (the constructor has defaults); a parameter it does not take is refused unless it takes
    `**kwargs` it does not declare."""
    hints, open_keywords = parameter_hints(target)
    schema = TypedDict(target_name(target), {name: NotRequired[yaml_hint(hint)] for name, hint in hints.items()})
    schema.__pydantic_config__ = ConfigDict(STRICT, extra="allow" if open_keywords else "forbid")
    return TypeAdapter(schema)


# -- one line per refusal ----------------------------------------------------------------------------------------------


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


def messages(errors: list[dict]) -> str:
    """pydantic's messages for one value, the arms of a union joined (`Input should be a valid list or ...`)."""
    said = list(dict.fromkeys(error["msg"] for error in errors))
    if len(said) == 1 or not all(msg.startswith("Input should be ") for msg in said):
        return said[0]
    parts = [msg.removeprefix("Input should be ") for msg in said]
    return f"Input should be {', '.join(parts[:-1])} or {parts[-1]}"


def framed(key: str, value: Any, errors: list[dict]) -> ConfigError:
    """`key=value: what pydantic says is wrong`, one line."""
    return ConfigError(f"{key}={value!r}: {messages(errors)}")


def check_value(key: str, value: Any, hint=Any) -> None:
    """One value against its type hint, in pydantic's strict mode (bounds, choices, finite numbers included)."""
    try:
        _adapter(hint).validate_python(value)
    except ValidationError as err:
        raise framed(key, value, err.errors()) from None


def check_node(prefix: str, node: dict, target, owner: str | None = None) -> None:
    """A `_target_` node's keys against `target`'s parameters (`node_schema`); `_target_`, `_partial_`, ... are
    Hydra's."""
    values = {name: value for name, value in node.items() if not (name.startswith("_") and name.endswith("_"))}
    try:
        node_schema(target).validate_python(values)
    except ValidationError as err:
        errors = err.errors()
        name = str(next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])["loc"][0])
        if name not in parameter_hints(target)[0]:
            raise not_a_key(f"{prefix}{name}", parameter_hints(target)[0], owner or target_name(target),
                            "a parameter") from None
        raise framed(f"{prefix}{name}", values[name], [e for e in errors if e["loc"][0] == name]) from None


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
            check_node(prefix, values, obj)


#: `model_validate(values, context=COMPOSITION)`: the composition alone (types, keys, what the values say about each
#: other), without what only the machine and the file system can refute (a check of a command line from Python).
COMPOSITION = "composition"


def composition_only(context: Any) -> bool:
    """Whether a settings check stops at the composition: `COMPOSITION`, or a `RunContext` that says so."""
    return context == COMPOSITION or bool(getattr(context, "composition_only", False))


class Settings(BaseModel):
    """A command's settings or a config group's: pydantic's strict mode, finite numbers, a key it does not declare
    refused (`extra="forbid"`); `model_validate` answers with one `ConfigError` line (`refusal`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    described_as: ClassVar[str] = "the config"

    @classmethod
    def model_validate(cls, obj: Any, **kwargs):
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as err:
            raise refusal(err, cls, obj) from None


class CommandSettings(Settings):
    """A command's settings. `imports`: the user's modules (recipes, poolers, evaluation families they register;
    common/plugins.py), imported before any other value is checked, so the names they register are known to it."""

    imports: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def import_user_modules(cls, values: Any) -> Any:
        if isinstance(values, dict):
            from promptemb.common.plugins import import_modules

            imports = values.get("imports")
            import_modules(imports if isinstance(imports, list) else None)
        return values


def refusal(err: ValidationError, settings: type[BaseModel], values: Any) -> ConfigError:
    """pydantic's verdict as one line: a key no field declares with the closest valid one, else `key=value: msg` for
    the first key found wrong (followed down the groups: `extras.print_config`)."""
    errors = err.errors()
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    owner, key, value = settings, [], values
    for part in map(str, error["loc"]):
        key.append(part)
        value = value.get(part) if isinstance(value, dict) else None
        field = owner.model_fields.get(part)
        arms = (field.annotation, *typing.get_args(field.annotation)) if field else ()
        owner = next((arm for arm in arms if isinstance(arm, type) and issubclass(arm, BaseModel)), None) or owner
        if not any(arm is owner for arm in arms):
            break
    if error["type"] == "extra_forbidden":
        return not_a_key(".".join(key), [name for name in owner.model_fields if name != "resolved"],
                         owner.described_as)
    if error["type"] == "missing":
        return ConfigError(f"{'.'.join(key)}: {error['msg']}")
    return framed(".".join(key), value, [e for e in errors if list(map(str, e["loc"]))[:len(key)] == key])


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
