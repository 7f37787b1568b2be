"""`train.py` / `promptemb-train`: train a prompt-based sentence encoder (`promptemb-train experiment=NAME`).

The command line is checked before Hydra composes it: an unknown experiment or override key is one line with the
closest valid name, instead of Hydra's multi-line block. Hydra's job name is set to `train` in configs/train.yaml, so
the run folder's log is train.log whichever way the command is started."""

from __future__ import annotations

import difflib
import re
import sys

import hydra
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from promptemb.common.cli import check_command_line
from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.common.overrides import first_of_sweeps, parse_overrides, sweep_values
from promptemb.configs import CONFIG_DIR
from promptemb.training.runner import run

MULTIRUN_FLAGS = ("-m", "--multirun")


def compose_train(overrides: list[str]) -> DictConfig:
    """train.py's config as Hydra composes it for these overrides (no run, no output directory)."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def experiment_names() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def check_experiment_overrides(argv: list[str]) -> None:
    """Fail with one line listing the valid names when `experiment=NAME` names no config (under -m, every name of
    a sweep such as `experiment=a,b`)."""
    multirun = any(arg in MULTIRUN_FLAGS for arg in argv)
    for arg in argv:
        if arg.lstrip("+").startswith("experiment="):
            names = [arg.split("=", 1)[1]]
            if multirun:
                try:
                    names = sweep_values(parse_overrides([arg])[0]) or names
                except Exception:  # a syntax error: Hydra reports it
                    return
            for name in names:
                if name not in experiment_names():
                    raise ConfigError(f"unknown experiment {name!r}; valid experiments: "
                                      f"{', '.join(experiment_names())}")


#: Common spellings of keys this config names differently (for the "did you mean" hint).
KEY_ALIASES = {"learning_rate": "lr", "tau": "temperature", "temp": "temperature", "bs": "batch_size",
               "batch": "batch_size", "steps": "max_steps", "epochs": "max_epochs"}


def elsewhere(cfg: DictConfig, leaf: str) -> str | None:
    """`group.leaf` when exactly one top-level group has that key (`lr` lives in `optimizer`, not in `model`)."""
    found = [f"{group}.{leaf}" for group in cfg if OmegaConf.is_dict(cfg[group]) and leaf in cfg[group]]
    return found[0] if len(found) == 1 else None


def unknown_key_message(key: str, overrides: list[str], where: str = "") -> str:
    """One line naming an override key that train.py's config does not have, with the closest existing key."""
    base = [o for o in overrides if not o.lstrip("+~").startswith(key + "=")]
    hint = ""
    try:
        cfg = compose_train(base)
        parent, _, leaf = key.lstrip("+~").rpartition(".")
        siblings = OmegaConf.select(cfg, parent) if parent else cfg
        names = [str(k) for k in siblings] if OmegaConf.is_dict(siblings) else []
        guess = KEY_ALIASES.get(leaf) if KEY_ALIASES.get(leaf) in names else None
        guess = guess or next(iter(difflib.get_close_matches(leaf, names, n=1, cutoff=0.75)), None)
        guess = '.'.join(filter(None, (parent, guess))) if guess else elsewhere(cfg, KEY_ALIASES.get(leaf, leaf))
        hint = f"did you mean {guess!r}? " if guess else ""
    except Exception:  # the other overrides do not compose either: no suggestion
        pass
    return (f"{where}{key!r} is not a key of train.py's config; {hint}"
            f"prefix it with '+' (+{key}=...) only if it is really a new key")


def check_override_keys(argv: list[str]) -> None:
    """Fail with one line naming an override key the composed config does not have (Hydra's own error is a
    multi-line traceback hint); under -m with each sweep's first value. Other Hydra flags (--cfg, ...) and hydra.*
    overrides are left to Hydra."""
    flags = [arg for arg in argv if arg.startswith("-")]
    if any(flag not in MULTIRUN_FLAGS for flag in flags):
        return
    overrides = [arg for arg in argv if not arg.startswith(("-", "hydra.", "hydra/"))]
    if flags:
        try:
            overrides = first_of_sweeps(overrides)
        except Exception:  # a syntax error: Hydra reports it
            return
    try:
        compose_train(overrides)
    except ConfigCompositionException as err:
        match = re.search(r"Could not override '([^']+)'", str(err))
        if match:
            raise ConfigError(unknown_key_message(match.group(1), overrides)) from None
    except Exception:  # anything else: Hydra reports it when train.py composes for real
        pass


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
@exit_on_user_error
def compose_and_run(cfg: DictConfig) -> float | None:
    """Returns the best STS-B dev [MASK] score (the objective of sweeps)."""
    return run(cfg)


def main() -> None:
    exit_on_user_error(check_command_line)("train", sys.argv[1:], check_experiment_overrides,
                                            check_override_keys)
    compose_and_run()
