"""Hydra and OmegaConf, in one place below the command lines: the application a command runs (`application`: compose
once, run a job with that very config, run a sweep), the running job as a `RunContext`, plain values from a composed
config, and `compose` for what composes a config without running it (Optuna trials, sweep files, tests). Everything
else works on plain values and typed settings (docs/layout.md, "From the command line to the objects it builds")."""

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
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from promptemb.common.errors import ConfigError, UserError, exit_on_user_error
from promptemb.common.run_context import RunContext
from promptemb.configs import CONFIG_DIR


def plain(config: DictConfig | dict) -> dict:
    """A composed config's values with every interpolation resolved (one line when one does not resolve)."""
    try:
        return OmegaConf.to_container(OmegaConf.create(config) if isinstance(config, dict) else config, resolve=True)
    except Exception as err:  # an interpolation that does not resolve
        raise ConfigError(f"the config does not resolve: {str(err).splitlines()[0]}") from None


def plain_values(cfg: DictConfig) -> dict:
    """The command's values of a composed config (Hydra's own node left out), every interpolation resolved."""
    values = OmegaConf.to_container(cfg, resolve=False)
    values.pop("hydra", None)
    return plain(values)


class Application:
    """Hydra's application for one command (its config tree): `compose` once, `run_job` with that very config (Hydra
    makes the run folder, writes `.hydra/`, configures logging, then runs the work), or `multirun` a sweep (the
    sweep's config, then one composition per job)."""

    def __init__(self, job_name: str):
        from hydra._internal.hydra import Hydra
        from hydra._internal.utils import create_automatic_config_search_path

        GlobalHydra.instance().clear()
        search_path = create_automatic_config_search_path(None, None, str(CONFIG_DIR))
        self.hydra = Hydra.create_main_hydra2(task_name=job_name, config_search_path=search_path)
        self.config_name: str | None = None

    def compose(self, config_name: str, overrides: list[str]) -> DictConfig:
        """A single run's config; `output_dir` is resolved here, once, so that the folder checked is the folder Hydra
        makes (a timestamp resolved twice would name two)."""
        self.config_name = config_name
        cfg = self.hydra.compose_config(config_name, overrides, run_mode=RunMode.RUN, with_log_configuration=False)
        with read_write(cfg), open_dict(cfg):
            cfg.hydra.mode = RunMode.RUN
            if "output_dir" in cfg:
                try:
                    cfg.output_dir = str(cfg.output_dir)
                except UserError:
                    raise
                except Exception as err:
                    raise ConfigError(f"output_dir does not resolve: {str(err).splitlines()[0]}") from None
        return cfg

    def run_job(self, cfg: DictConfig, work: Callable[[], Any]) -> Any:
        """Hydra's job around `work()` with the composed `cfg`; the work's exception is raised as it is."""
        from hydra._internal.callbacks import Callbacks
        from hydra.core.utils import JobStatus, run_job
        from hydra.types import HydraContext

        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=self.config_name)
        returned = run_job(hydra_context=HydraContext(config_loader=self.hydra.config_loader, callbacks=callbacks),
                           task_function=lambda _cfg: work(), config=cfg, job_dir_key="hydra.run.dir",
                           job_subdir_key=None, configure_logging=True)
        callbacks.on_run_end(config=cfg, config_name=self.config_name, job_return=returned)
        if returned.status == JobStatus.FAILED:
            raise returned._return_value  # Hydra's `return_value` would print a line of its own first
        return returned.return_value

    @staticmethod
    def close() -> None:
        """Let another application (or `compose`) take Hydra's global state (checks run from Python)."""
        GlobalHydra.instance().clear()

    def multirun(self, config_name: str, task: Callable[[DictConfig], Any], overrides: list[str]) -> Any:
        self.config_name = config_name  # each job's HydraConfig says MULTIRUN, as Hydra's main makes it for -m
        return self.hydra.multirun(config_name, task, [*overrides, "hydra.mode=MULTIRUN"], with_log_configuration=True)


def application(job_name: str) -> Application:
    return Application(job_name)


def composed_context(cfg: DictConfig) -> RunContext:
    """The single run a composed config describes, before Hydra's job starts."""
    output_dir = cfg.get("output_dir")
    return RunContext(overrides=tuple(OmegaConf.to_container(cfg.hydra.overrides.task)),
                      run_dir=Path(output_dir) if output_dir else None)


def job_task(work: Callable[[dict, RunContext], Any]) -> Callable[[DictConfig], Any]:
    """One job of a sweep: `work` with its config (composed by Hydra) as plain values, and the running job."""
    def task(cfg: DictConfig) -> Any:
        return work(plain(cfg), running_context())
    return task


def hydra_main(config_name: str, work: Callable[[dict, RunContext], Any]) -> Any:
    """Hydra's own command line (`--cfg job`, `--help`, ...): its main reads sys.argv."""
    import hydra

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=config_name)
    @exit_on_user_error  # inside the job: Hydra's main would print a UserError as a traceback
    def task(cfg: DictConfig) -> Any:
        return work(plain(cfg), running_context())

    return task()


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
    """`${name:...}` in the config tree calls `resolver` (training/run_folder.py: `promptemb.run_dir`)."""
    OmegaConf.register_new_resolver(name, resolver, replace=True)
