"""What every entry point (train.py, evaluate.py, promptemb-encode, export.py) checks on its command line before
Hydra composes it. Nothing is rewritten: a mistake Hydra would answer with a multi-line traceback or block (an
override key of the earlier config layout, a template quoted for the shell but not for Hydra, an unknown key or
group option, a run folder that cannot be created) is one `error:` line here instead, with the closest valid name."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from hydra.errors import ConfigCompositionException, MissingConfigException

from promptemb.common.errors import ConfigError
from promptemb.common.hydra_bridge import compose_config, compose_run_dir, plain, unknown_key
from promptemb.common.overrides import first_of_sweeps, parse_overrides, sweep_values
from promptemb.common.validation import COMPOSITION, Settings, UnknownKeyError, check_writable_dir
from promptemb.configs import CONFIG_DIR

#: The config each entry point composes (`encode` = `promptemb-encode`, evaluate.py's encode mode).
CONFIG_NAMES = {"train": "train", "evaluate": "eval", "encode": "encode", "export": "export"}
#: How each entry point is named in messages.
ENTRY_NAMES = {"train": "train.py", "evaluate": "evaluate.py", "encode": "promptemb-encode", "export": "export.py"}
MULTIRUN_FLAGS = ("-m", "--multirun")

#: Override keys of the earlier config layout -> the key that replaced them, per entry point. `parent.*` renames
#: every other key under `parent`; a value with spaces is advice rather than a key.
RENAMED_KEYS = {
    "train": {
        "module": "model",
        "module.lr": "optimizer.lr",
        "module.weight_decay": "optimizer.weight_decay",
        "module.warmup_ratio": "scheduler.warmup_ratio",
        "module.model_name_or_path": "backbone.name_or_path",
        "module.template": "template.text",
        "module.templates": "template.text and template.second_text (or template=NAME of configs/template/)",
        "module.sentence_rule": "template.sentence_rule",
        "module.*": "model.*",
        "model.lr": "optimizer.lr",
        "model.weight_decay": "optimizer.weight_decay",
        "model.warmup_ratio": "scheduler.warmup_ratio",
        "prompt": "template",
        "template_pair": "template",
    },
    "evaluate": {
        "model": "backbone",
        "model.*": "backbone.*",
        "prompt": "template",
        "sentence_rule": "template.sentence_rule",
    },
}
RENAMED_KEYS["encode"] = RENAMED_KEYS["evaluate"]
#: Option names that changed with their group: (entry point, old key) -> {old name: new name}; `*` = any name.
RENAMED_OPTIONS = {
    ("train", "template_pair"): {"bert": "promptbert_bert_pair", "roberta": "promptbert_roberta_pair", "*": "*_pair"},
}
#: Groups whose options a user may give to the wrong group: (entry point, key) -> group that has them.
OTHER_GROUP = {("train", "model"): "backbone"}


def split_override(arg: str) -> tuple[str, str, str]:
    """(`+`/`~` prefix, key, value) of a command-line override."""
    prefix = re.match(r"^[+~]*", arg).group(0)
    key, _, value = arg[len(prefix):].partition("=")
    return prefix, key, value


def overrides_of(argv: list[str]) -> list[tuple[str, str, str]]:
    """(prefix, key, value) of each override of a command line; flags (-m, --cfg, ...) left out."""
    return [split_override(arg) for arg in argv if not arg.startswith("-") and "=" in arg]


def group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def renamed_key(entry: str, key: str) -> str | None:
    renames = RENAMED_KEYS.get(entry, {})
    if key in renames:
        return renames[key]
    parent, dot, leaf = key.partition(".")
    if dot and f"{parent}.*" in renames:
        return renames[f"{parent}.*"].replace("*", leaf)
    return None


def check_renamed_keys(entry: str, argv: list[str]) -> None:
    """One line naming the new spelling of an override written for the earlier config layout."""
    for prefix, key, value in overrides_of(argv):
        new_key = renamed_key(entry, key)
        if new_key is not None and " " in new_key:
            raise ConfigError(f"{key!r} is no longer a key: set {new_key}")
        if new_key is not None:
            options = RENAMED_OPTIONS.get((entry, key), {})
            new_value = options.get(value) or options.get("*", "*").replace("*", value)
            raise ConfigError(f"{key!r} is now {new_key!r} (configs were reorganised): write "
                              f"{prefix}{new_key}={new_value}")
        group = OTHER_GROUP.get((entry, key))
        if group and value in group_options(group) and value not in group_options(key):
            raise ConfigError(f"{value!r} is a {group} (configs/{group}/), not a {key}: write {group}={value} "
                              f"(valid {key}: {', '.join(group_options(key))})")
        if key == "template" and "[X]" in value:
            raise ConfigError(f"template= names a template config ({', '.join(group_options('template'))}); your "
                              f"own text goes in template.text: {shell_quoted(hydra_quoted('template.text', value))}")


def hydra_quoted(key: str, value: str) -> str:
    """`key='value'` in Hydra's grammar: inside single quotes, a quote and the backslashes before one are escaped."""
    escaped = re.sub(r"(\\+)(?='|$)", r"\1\1", value).replace("'", "\\'")
    return f"{key}='{escaped}'"


def shell_quoted(arg: str) -> str:
    """`arg` as one word for POSIX shells, in double quotes (readable for templates full of quotes)."""
    return '"' + re.sub(r'([\\"$`])', r"\\\1", arg) + '"'


def check_override_syntax(argv: list[str]) -> None:
    """A value with quotes that Hydra cannot read (the shell removed the quotes meant for Hydra), or a pooler ensemble
    written as a function call (`poolers=[ensemble(pcot,ke)]`): one line giving the spelling that works. Other syntax
    errors are left to Hydra's own message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        try:
            parser.parse_overrides([arg])
        except OverrideParseException:
            prefix, key, value = split_override(arg)
            if key.rsplit(".", 1)[-1] in ("poolers", "pooler") and re.search(r"\w\(", value):
                raise ConfigError(f"Hydra reads {value} as a function call; join the members of a pooler ensemble "
                                  f"with '+': {key}=[pcot+ke]") from None
            if any(char in value for char in "\"'"):
                raise ConfigError(f"Hydra cannot read the value of {key} ({value!r}) unquoted: quote it for Hydra "
                                  f"inside the shell's quotes, e.g. {shell_quoted(hydra_quoted(prefix + key, value))}"
                                  ) from None


#: Common spellings of keys this config names differently (for the "did you mean" hint).
KEY_ALIASES = {"learning_rate": "lr", "tau": "temperature", "temp": "temperature", "bs": "batch_size",
               "batch": "batch_size", "steps": "max_steps", "epochs": "max_epochs"}


def elsewhere(cfg: dict, leaf: str) -> str | None:
    """`group.leaf` when exactly one top-level group has that key (`lr` lives in `optimizer`, not in `model`)."""
    found = [f"{group}.{leaf}" for group, node in cfg.items() if isinstance(node, dict) and leaf in node]
    return found[0] if len(found) == 1 else None


def closest_key(leaf: str, value: str, siblings: dict) -> str | None:
    """The closest name to `leaf`; among close ones, first one whose value has the override's shape (a list for
    `[...]`), so `poolerz=[mask]` suggests `poolers`, not `pooler`."""
    close = difflib.get_close_matches(leaf, [str(name) for name in siblings], n=3, cutoff=0.75)
    shaped = [name for name in close if isinstance(siblings[name], list) == value.startswith("[")]
    return next(iter(shaped or close), None)


#: Open argument maps (evaluate.py's top level, the training callback's node): every key under them is new to the
#: config, so Hydra wants it written with `+`.
ARGUMENT_MAPS = ("pooler_args", "post_args", "transfer_args", "clustering_args")


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
    """One line naming a config-group option that does not exist, with the closest existing one."""
    guess = next(iter(difflib.get_close_matches(name, options, n=1, cutoff=0.6)), None)
    hint = f"did you mean {group}={guess}? " if guess else ""
    return (f"{ENTRY_NAMES[entry]}: there is no {group} {name!r} (configs/{group}/{name}.yaml); {hint}"
            f"valid {group}: {', '.join(options)}")


def check_override_keys(entry: str, argv: list[str], settings: type[Settings] | None = None) -> None:
    """Fail with one line naming an override key the composed config does not have, or a group option that does not
    exist (Hydra's own error is a multi-line block; its exception names the key or the option and its group); under
    -m with each sweep's first value, and there also a key Hydra accepts (`+key=...`) that no job's `settings` has:
    refused once, before Hydra writes the sweep's folder, rather than recorded as a failure of every job (any other
    refusal is the job's own: another value of a sweep may be valid). Other Hydra flags (--cfg, ...) and hydra.*
    overrides are left to Hydra."""
    flags = [arg for arg in argv if arg.startswith("-")]
    if any(flag not in MULTIRUN_FLAGS for flag in flags):
        return
    overrides = [arg for arg in argv if not arg.startswith(("-", "hydra.", "hydra/"))]
    try:
        if flags:  # Hydra composes the jobs one by one: a missing option would end the sweep at its job
            check_sweep_options(entry, overrides)
            overrides = first_of_sweeps(overrides)
        composed = compose_config(CONFIG_NAMES[entry], overrides)
    except ConfigError:  # a sweep's missing option
        raise
    except MissingConfigException as err:  # Hydra names the missing option and lists its group's options
        group, _, name = (err.missing_cfg_file or "").rpartition("/")
        if group and err.options:
            raise ConfigError(unknown_option_message(group, name, entry, err.options)) from None
        return
    except ConfigCompositionException as err:
        if (missing := unknown_key(err)) is not None:  # the error behind Hydra's names the key and its node
            found, cfg = missing  # the first part missing: the override that reaches it is the key meant
            key, value = next(((key, value) for _, key, value in overrides_of(overrides)
                               if key == found or key.startswith(f"{found}.")), (found, ""))
            raise ConfigError(unknown_key_message(key, value, cfg, entry=entry)) from None
        return
    except Exception:  # a syntax error, or anything else: Hydra reports it when the entry point composes for real
        return
    if flags and settings is not None:
        try:
            settings.model_validate(plain(composed), context=COMPOSITION)
        except UnknownKeyError:
            raise
        except Exception:  # a value a job refuses, or one that resolves only in the job: the jobs report it
            pass


def check_sweep_options(entry: str, overrides: list[str]) -> None:
    """Every option a multirun sweeps over in a config group (`experiment=a,b`, `template=choice(...)`) exists."""
    for override in parse_overrides(overrides):
        group = override.key_or_group
        for name in sweep_values(override) if (CONFIG_DIR / group).is_dir() else ():
            if name not in (options := group_options(group)):
                raise ConfigError(unknown_option_message(group, name, entry, options))


def check_run_dir_before_hydra(config_name: str, argv: list[str]) -> None:
    """Hydra creates the run folder (`hydra.run.dir`, which is `output_dir`) before the task starts, and fails with
    a traceback when it cannot: check that it can, first, with one line. Flags (-m, --cfg, ...) are left to Hydra."""
    if any(arg.startswith("-") for arg in argv):
        return
    try:
        run_dir = compose_run_dir(config_name, argv)
    except Exception:  # overrides that do not compose: Hydra reports them
        return
    check_writable_dir("output_dir", run_dir)


def check_command_line(entry: str, argv: list[str], *entry_checks: Callable[[list[str]], None],
                       settings: type[Settings] | None = None) -> None:
    """Every check before Hydra composes the config of `entry` (train | evaluate | encode | export), with the entry
    point's own `entry_checks` of its overrides, and under -m the keys of its `settings`; raises a one-line
    ConfigError."""
    check_renamed_keys(entry, argv)
    check_override_syntax(argv)
    for check in entry_checks:
        check(argv)
    check_override_keys(entry, argv, settings)
    check_run_dir_before_hydra(CONFIG_NAMES[entry], argv)
