"""What train.py and evaluate.py check on their command line before Hydra composes it. Nothing is rewritten: a
mistake Hydra would answer with a multi-line traceback (an override key of the earlier config layout, a template
quoted for the shell but not for Hydra, an unknown experiment or key, a run folder that cannot be created) is one
`error:` line here instead."""

from __future__ import annotations

import re
from collections.abc import Callable

from promptemb.common.errors import ConfigError
from promptemb.common.run_folder import check_run_dir_before_hydra
from promptemb.configs import CONFIG_DIR

#: The config each entry point composes.
CONFIG_NAMES = {"train": "train", "evaluate": "eval"}

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


def group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def renamed_key(entry: str, key: str) -> str | None:
    renames = RENAMED_KEYS[entry]
    if key in renames:
        return renames[key]
    parent, dot, leaf = key.partition(".")
    if dot and f"{parent}.*" in renames:
        return renames[f"{parent}.*"].replace("*", leaf)
    return None


def check_renamed_keys(entry: str, argv: list[str]) -> None:
    """One line naming the new spelling of an override written for the earlier config layout."""
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        prefix, key, value = split_override(arg)
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
    """A value with quotes that Hydra cannot read (the shell removed the quotes meant for Hydra): one line giving the
    spelling that works. Other syntax errors are left to Hydra's own message."""
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
            if any(char in value for char in "\"'"):
                raise ConfigError(f"Hydra cannot read the value of {key} ({value!r}) unquoted: quote it for Hydra "
                                  f"inside the shell's quotes, e.g. {shell_quoted(hydra_quoted(prefix + key, value))}"
                                  ) from None


def check_command_line(entry: str, argv: list[str], *entry_checks: Callable[[list[str]], None]) -> None:
    """Every check before Hydra composes the config of `entry` (train | evaluate), with the entry point's own
    `entry_checks` of its overrides; raises a one-line ConfigError."""
    check_renamed_keys(entry, argv)
    check_override_syntax(argv)
    for check in entry_checks:
        check(argv)
    check_run_dir_before_hydra(CONFIG_NAMES[entry], argv)
