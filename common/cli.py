"""How every command runs (train.py, evaluate.py, promptemb-encode, export.py): Hydra composes the command line
ONCE, the command's settings check it once, then Hydra runs the job with that very config.

    run_command("train", sys.argv[1:], TrainSettings, train_run, around_job=take_run_folder)

Every mistake is one `error:` line (exit 2) before anything is written: an override Hydra cannot parse (with the
shell quoting that works), a key or group option the config does not have (with the closest names; Hydra's own
exception names the key or the option, the OmegaConf error behind it the config composed so far), a value the
settings refuse. For a single run the check comes before Hydra's job starts, so a refusal leaves no run folder and
changes nothing in an existing one; `around_job` (train.py: the run folder's preflight and lock) is entered after
the check and held while the job runs. Under `-m` Hydra composes the sweep and each job (the sweep's own composition,
then one per job); each job is checked in it, and a refused job is that job's failure. Hydra's other flags (`--cfg`,
`--help`, ...) take Hydra's own path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

from promptemb.common.errors import ConfigError, UserError, exit_on_user_error
from promptemb.common.registry import choices_hint, closest
from promptemb.common.run_context import RunContext
from promptemb.configs import CONFIG_DIR

#: The config each entry point composes (`encode` = `promptemb-encode`, evaluate.py's encode mode).
CONFIG_NAMES = {"train": "train", "evaluate": "eval", "encode": "encode", "export": "export"}
#: How each entry point is named in messages.
ENTRY_NAMES = {"train": "train.py", "evaluate": "evaluate.py", "encode": "promptemb-encode", "export": "export.py"}
MULTIRUN_FLAGS = ("-m", "--multirun")


def split_override(arg: str) -> tuple[str, str, str]:
    """(`+`/`~` prefix, key, value) of a command-line override."""
    prefix = re.match(r"^[+~]*", arg).group(0)
    key, _, value = arg[len(prefix):].partition("=")
    return prefix, key, value


def overrides_of(argv: list[str] | tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(prefix, key, value) of each override of a command line; flags (-m, --cfg, ...) left out."""
    return [split_override(arg) for arg in argv if not arg.startswith("-") and "=" in arg]


def group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


# -- one line for what Hydra would answer with a block --------------------------------------------------------------


def hydra_quoted(key: str, value: str) -> str:
    """`key='value'` in Hydra's grammar: inside single quotes, a quote and the backslashes before one are escaped."""
    escaped = re.sub(r"(\\+)(?='|$)", r"\1\1", value).replace("'", "\\'")
    return f"{key}='{escaped}'"


def shell_quoted(arg: str) -> str:
    """`arg` as one word for POSIX shells, in double quotes (readable for templates full of quotes)."""
    return '"' + re.sub(r'([\\"$`])', r"\\\1", arg) + '"'


def check_override_syntax(argv: list[str]) -> None:
    """A value with quotes that Hydra cannot read (the shell removed the quotes meant for Hydra), a template text
    given as a template option, or a pooler ensemble written as a function call: one line giving the spelling that
    works. Other syntax errors: Hydra's own first line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        prefix, key, value = split_override(arg)
        if key == "template" and "[X]" in value:
            raise ConfigError(f"template= names a template config ({', '.join(group_options('template'))}); your "
                              f"own text goes in template.text: {shell_quoted(hydra_quoted('template.text', value))}")
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as err:
            if key.rsplit(".", 1)[-1] in ("poolers", "pooler") and re.search(r"\w\(", value):
                raise ConfigError(f"Hydra reads {value} as a function call; join the members of a pooler ensemble "
                                  f"with '+': {key}=[pcot+ke]") from None
            if any(char in value for char in "\"'"):
                raise ConfigError(f"Hydra cannot read the value of {key} ({value!r}) unquoted: quote it for Hydra "
                                  f"inside the shell's quotes, e.g. {shell_quoted(hydra_quoted(prefix + key, value))}"
                                  ) from None
            raise ConfigError(f"cannot read the override {arg!r}: {first_line(err)}") from None


#: Common spellings of keys this config names differently (for the "did you mean" hint).
KEY_ALIASES = {"learning_rate": "lr", "tau": "temperature", "temp": "temperature", "bs": "batch_size",
               "batch": "batch_size", "steps": "max_steps", "epochs": "max_epochs"}
#: Open argument maps (evaluate.py's top level, the training callback's node): every key under them is new to the
#: config, so Hydra wants it written with `+`.
ARGUMENT_MAPS = ("pooler_args", "post_args", "family_args")


def elsewhere(cfg: dict, leaf: str) -> str | None:
    """`group.leaf` when exactly one top-level group has that key (`lr` lives in `optimizer`, not in `model`)."""
    found = [f"{group}.{leaf}" for group, node in cfg.items() if isinstance(node, dict) and leaf in node]
    return found[0] if len(found) == 1 else None


def closest_key(leaf: str, value: str, siblings: dict) -> str | None:
    """The closest name to `leaf`; among close ones, first one whose value has the override's shape (a list for
    `[...]`, a map for `{...}`, else a single value), so `poolerz=[mask]` suggests `poolers`, not `pooler`; with none
    of that shape, the closest."""
    def shape(node) -> str:
        return "list" if isinstance(node, list) else "map" if isinstance(node, dict) else "value"

    wanted = "list" if value.startswith("[") else "map" if value.startswith("{") else "value"
    close = closest(leaf, [str(name) for name in siblings], 3)
    shaped = [name for name in close if shape(siblings[name]) == wanted]
    return next(iter(shaped or close), None)


def unknown_key_message(key: str, value: str, cfg: dict, where: str = "", entry: str = "train") -> str:
    """One line naming an override key that `entry`'s composed config `cfg` does not have, with the closest existing
    key; under an open argument map (`pooler_args.first_last.layers=[0,-1]`), the `+` spelling that adds it."""
    parts = key.split(".")
    argument_map = next((part for part in parts[:-1] if part in ARGUMENT_MAPS), None)
    if argument_map:
        return (f"{where}{key!r} is a new key (the config's {argument_map} is empty): Hydra adds it with '+': write "
                f"+{key}={value}")
    siblings = cfg
    for part in parts[:-1]:
        siblings = siblings.get(part) if isinstance(siblings, dict) else None
    siblings, leaf = siblings if isinstance(siblings, dict) else {}, parts[-1]
    guess = KEY_ALIASES.get(leaf) if KEY_ALIASES.get(leaf) in siblings else closest_key(leaf, value, siblings)
    guess = ".".join([*parts[:-1], guess]) if guess else elsewhere(cfg, KEY_ALIASES.get(leaf, leaf))
    hint = f"did you mean {guess!r}? " if guess else ""
    return (f"{where}{key!r} is not a key of {ENTRY_NAMES[entry]}'s config; {hint}"
            f"prefix it with '+' (+{key}=...) only if it is really a new key")


def unknown_option_message(group: str, name: str, entry: str, options: list[str]) -> str:
    """One line naming a config-group option that does not exist, with the closest few (where the options are many,
    where the rest are listed)."""
    return (f"{ENTRY_NAMES[entry]}: there is no {group} {name!r} (configs/{group}/{name}.yaml); "
            f"{choices_hint(name, options, f'configs/{group}/')}")


def check_sweep_options(entry: str, overrides: list[str]) -> None:
    """Every option a multirun sweeps over in a config group (`experiment=a,b`, `template=choice(...)`) exists:
    Hydra would end the sweep at the first job whose option is missing."""
    from promptemb.common.overrides import parse_overrides, sweep_values

    for override in parse_overrides(overrides):
        group = override.key_or_group
        for name in sweep_values(override) if (CONFIG_DIR / group).is_dir() else ():
            if name not in (options := group_options(group)):
                raise ConfigError(unknown_option_message(group, name, entry, options))


def check_sweep_keys(entry: str, app, overrides: list[str], check: Callable[[dict, RunContext], Any]) -> None:
    """Before a sweep starts: every option it sweeps over exists, and its first job's composition has no key the
    command's settings do not take (wrong in every job alike: refused once, not recorded as a failure of each).
    Any other refusal is the job's own: another value of a sweep may be valid."""
    from promptemb.common import hydra_bridge
    from promptemb.common.overrides import first_of_sweeps
    from promptemb.common.validation import UnknownKeyError

    check_sweep_options(entry, overrides)
    first = first_of_sweeps(overrides)
    with composition_errors(entry, first):
        cfg = app.compose(CONFIG_NAMES[entry], first)
    context = dataclasses.replace(hydra_bridge.composed_context(cfg), composition_only=True)
    try:
        check(hydra_bridge.plain_values(cfg), context)
    except UnknownKeyError:
        raise
    except UserError:
        pass


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@contextlib.contextmanager
def composition_errors(entry: str, overrides: list[str]) -> Iterator[None]:
    """Hydra's composition failures as one line: a key or a group option the config does not have, with the closest
    names; any other, Hydra's first line."""
    from hydra.errors import ConfigCompositionException, MissingConfigException

    from promptemb.common.hydra_bridge import unknown_key

    try:
        yield
    except MissingConfigException as err:  # Hydra names the missing option and lists its group's options
        group, _, name = (err.missing_cfg_file or "").rpartition("/")
        if group and err.options:
            raise ConfigError(unknown_option_message(group, name, entry, list(err.options))) from None
        raise ConfigError(f"{ENTRY_NAMES[entry]}: {first_line(err)}") from None
    except ConfigCompositionException as err:
        if (missing := unknown_key(err)) is not None:  # the error behind Hydra's names the key and its node
            found, cfg = missing  # the first part missing: the override that reaches it is the key meant
            key, value = next(((key, value) for _, key, value in overrides_of(overrides)
                               if key == found or key.startswith(f"{found}.")), (found, ""))
            raise ConfigError(unknown_key_message(key, value, cfg, entry=entry)) from None
        cause = err.__cause__ or err
        raise ConfigError(f"{ENTRY_NAMES[entry]}: {first_line(cause)}") from None


# -- the one way to run ---------------------------------------------------------------------------------------------


def run_command(entry: str, argv: list[str], check: Callable[[dict, RunContext], Any],
                run: Callable[[Any, RunContext, Any], Any],
                prepare: Callable[[Any, RunContext], contextlib.AbstractContextManager] | None = None,
                sweep_job: Callable[[dict, RunContext], Any] | None = None,
                precheck: Callable[[list[str]], None] | None = None) -> Any:
    """`entry`'s command line: `precheck(overrides)` (what the command refuses before composing, with a better
    message than the composition's), then composed once, `check(values, context)` -> settings, `prepare(settings,
    context)` entered (before Hydra's job: nothing of the job is written yet) and what it yields handed to
    `run(settings, context, prepared)` inside Hydra's job. Under -m each job runs `sweep_job(values, context)`
    (default: the same three steps). A UserError anywhere is one `error:` line (exit 2, or the error's own code)."""
    return exit_on_user_error(_run_command)(entry, argv, check, run, prepare, sweep_job, precheck)


def _run_command(entry, argv, check, run, prepare, sweep_job, precheck) -> Any:
    from promptemb.common import hydra_bridge

    def checked_run(values: dict, context: RunContext) -> Any:
        settings = check(values, context)
        with prepare(settings, context) if prepare else contextlib.nullcontext() as prepared:
            return run(settings, context, prepared)

    config_name = CONFIG_NAMES[entry]
    flags = [arg for arg in argv if arg.startswith("-")]
    if any(flag not in MULTIRUN_FLAGS for flag in flags):  # --cfg job, --help, ...: Hydra's own path
        return hydra_bridge.hydra_main(config_name, checked_run)
    overrides = [arg for arg in argv if not arg.startswith("-")]
    check_override_syntax(overrides)
    if precheck:
        precheck(overrides)
    app = hydra_bridge.application(ENTRY_NAMES[entry].removesuffix(".py"))
    if flags:  # -m: the sweep, then each job composed by Hydra and checked in it
        check_sweep_keys(entry, app, overrides, check)
        with composition_errors(entry, overrides):
            return app.multirun(config_name, hydra_bridge.job_task(sweep_job or checked_run), overrides)
    with composition_errors(entry, overrides):
        cfg = app.compose(config_name, overrides)
    context = hydra_bridge.composed_context(cfg)
    settings = check(hydra_bridge.plain_values(cfg), context)
    with prepare(settings, context) if prepare else contextlib.nullcontext() as prepared:
        return app.run_job(cfg, lambda: run(settings, hydra_bridge.running_context(), prepared))


def check_command_line(entry: str, argv: list[str], check: Callable[[dict, RunContext], Any],
                       composition_only: bool = False, precheck: Callable[[list[str]], None] | None = None) -> Any:
    """What `run_command` would run with, or its one-line refusal (a ConfigError), without running anything: the
    command line composed once and checked (under -m: every swept option, then the first job's values);
    `composition_only`: without what only the machine and the file system can refute."""
    from promptemb.common import hydra_bridge
    from promptemb.common.overrides import first_of_sweeps

    multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
    overrides = [arg for arg in argv if not arg.startswith("-")]
    check_override_syntax(overrides)
    if precheck:
        precheck(overrides)
    if multirun:
        check_sweep_options(entry, overrides)
        overrides = first_of_sweeps(overrides)
    app = hydra_bridge.application(ENTRY_NAMES[entry].removesuffix(".py"))
    try:
        with composition_errors(entry, overrides):
            cfg = app.compose(CONFIG_NAMES[entry], overrides)
        context = dataclasses.replace(hydra_bridge.composed_context(cfg), composition_only=composition_only)
        return check(hydra_bridge.plain_values(cfg), context)
    finally:
        app.close()
