"""Hydra and OmegaConf, in one place below the command lines. The command lines hand the config Hydra composed to
`plain` and read the running job with `running_context`; checks, Optuna trials and sweep files compose a command's
config with `compose`; the run-folder resolver is registered with `register_resolver`. Everything else works on
plain values and typed settings (docs/layout.md, "From the command line to the objects it builds")."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from promptemb.common.errors import ConfigError
from promptemb.common.run_context import RunContext
from promptemb.configs import CONFIG_DIR


def plain(config: DictConfig | dict) -> dict:
    """A composed config's values with every interpolation resolved (one line when one does not resolve)."""
    try:
        return OmegaConf.to_container(OmegaConf.create(config) if isinstance(config, dict) else config, resolve=True)
    except Exception as err:  # an interpolation that does not resolve
        raise ConfigError(f"the config does not resolve: {str(err).splitlines()[0]}") from None


def compose_config(config_name: str, overrides: list[str], hydra: bool = False) -> DictConfig:
    """`config_name`'s config (configs/NAME.yaml) as Hydra composes it for `overrides`, without running anything;
    `hydra`: with Hydra's own node."""
    if GlobalHydra.instance().is_initialized():  # inside a running command (an Optuna trial): its search path
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=hydra)
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=hydra)


def compose(config_name: str, overrides: list[str], resolve: bool = True) -> dict:
    """`compose_config` as plain values, interpolations resolved unless `resolve` is false (the keys and their
    shapes are all it needs)."""
    composed = compose_config(config_name, overrides)
    return plain(composed) if resolve else OmegaConf.to_container(composed)


def resolved_values(config: dict, *keys: str) -> list:
    """The resolved values of some keys of a composed config, the others left unresolved."""
    composed = OmegaConf.create(config)
    return [OmegaConf.select(composed, key) for key in keys]


def unknown_key(err: Exception) -> tuple[str, dict] | None:
    """(the key, the values of the config as composed so far: unresolved, without Hydra's node) when Hydra could not
    override a key its config does not have, as OmegaConf names them in the error behind Hydra's; None for any other
    composition error."""
    missing = err.__cause__
    if not isinstance(missing, ConfigAttributeError | ConfigKeyError) or missing.parent_node is None:
        return None
    # the whole config, not the node: OmegaConf has no public accessor of a node's root (2.x keeps `_get_root`)
    values = OmegaConf.to_container(missing.parent_node._get_root(), resolve=False)
    values.pop("hydra", None)
    return missing.full_key, values


def compose_run_dir(config_name: str, overrides: list[str]) -> str:
    """The folder Hydra would create for a single run of these overrides (`hydra.run.dir`)."""
    return str(OmegaConf.select(compose_config(config_name, overrides, hydra=True), "hydra.run.dir"))


def running_context() -> RunContext:
    """The running Hydra job as a `RunContext` (the default outside Hydra)."""
    if not HydraConfig.initialized():
        return RunContext()
    job = HydraConfig.get()
    multirun = job.mode == RunMode.MULTIRUN
    output_dir = None
    with contextlib.suppress(Exception):  # not set while Hydra is still resolving it
        output_dir = Path(job.runtime.output_dir)
    return RunContext(overrides=tuple(job.overrides.task), run_dir=None if multirun else output_dir,
                      multirun=multirun, job_dir=output_dir if multirun else None,
                      sweep_dir=Path(job.sweep.dir) if multirun else None)


def register_resolver(name: str, resolver: Callable[..., Any]) -> None:
    """`${name:...}` in the config tree calls `resolver` (training/run_dirs.py: `promptemb.run_dir`)."""
    OmegaConf.register_new_resolver(name, resolver, replace=True)
