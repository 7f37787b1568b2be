"""Loggers from the `logger` config group: csv (default, no account), wandb, or several at once (many_loggers).

W&B specifics handled here, before any run is created:
* the mode (online | offline | disabled) is checked, and online mode without credentials is a one-line ConfigError
  (never an interactive login prompt);
* on resume, the W&B run id stored in the checkpoint (callbacks/wandb_run.py) is passed as `id` (WandbLogger uses
  `resume="allow"`), so the resumed training continues the same W&B run;
* the full resolved config is logged as the run config (rank 0 only: `log_hyperparams` is rank-zero-only).
"""

from __future__ import annotations

import logging
import os

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from pytorch_lightning.loggers import Logger, WandbLogger

from promptemb.callbacks.wandb_run import wandb_run_id
from promptemb.common.errors import ConfigError
from promptemb.common.optional import require

log = logging.getLogger(__name__)

WANDB_TARGET = "pytorch_lightning.loggers.WandbLogger"
RESUMABLE_CSV_TARGET = "promptemb.training.csv_logger.ResumableCSVLogger"
WANDB_MODES = ("online", "offline", "disabled")
NO_CREDENTIALS = ("W&B online logging needs credentials: run `wandb login` or set WANDB_API_KEY, "
                  "or use logger.mode=offline / logger.mode=disabled / logger=csv")


def logger_configs(cfg_logger: dict | None) -> dict[str, dict]:
    """{name: logger config}: one config with `_target_` (logger=csv / wandb) or a mapping of them (many_loggers)."""
    if not cfg_logger:
        return {}
    if "_target_" in cfg_logger:
        return {"logger": cfg_logger}
    return {name: sub for name, sub in cfg_logger.items() if sub}


def is_wandb(cfg_logger: dict) -> bool:
    return cfg_logger.get("_target_") in (WANDB_TARGET, "lightning.pytorch.loggers.WandbLogger")


def wandb_has_credentials() -> bool:
    """True when an API key is configured (WANDB_API_KEY, identity token, netrc, settings). No network, no prompt."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth

        host = wandb_setup.singleton().settings.base_url
        return wbauth.authenticate_session(host=host, source="promptemb", prompt=False,
                                           update_session=False) is not None
    except Exception:  # private API of this wandb version moved or failed: fall back to the documented places
        import netrc
        try:
            return any(host.endswith(("wandb.ai", "wandb.com")) for host in netrc.netrc().hosts)
        except (FileNotFoundError, netrc.NetrcParseError, OSError):
            return False


def check_wandb_config(cfg_logger: dict) -> None:
    mode = cfg_logger.get("mode") or "online"
    if mode not in WANDB_MODES:
        raise ConfigError(f"logger.mode={mode!r} is not a W&B mode; use one of {', '.join(WANDB_MODES)}")
    if mode == "online" and not wandb_has_credentials():
        raise ConfigError(NO_CREDENTIALS)




def build_loggers(cfg_logger: dict | None, resume: dict | None = None) -> list[Logger]:
    """Instantiate the configured loggers. `resume`: the checkpoint dict being resumed from (W&B: its run id is
    continued; CSV: the rows before its step are kept). W&B configs are checked first."""
    loggers = []
    for name, sub in logger_configs(cfg_logger).items():
        if sub.get("_target_") == RESUMABLE_CSV_TARGET and resume is not None:
            sub = {**sub, "resume_step": int(resume.get("global_step", 0))}
        if is_wandb(sub):
            require("wandb", "logger=wandb")
            check_wandb_config(sub)
            run_id = wandb_run_id(resume) if resume is not None else None
            if run_id and not sub.get("id") and sub.get("mode") != "disabled":
                log.info("resuming W&B run %s (id saved in the checkpoint)", run_id)
                sub = {**sub, "id": run_id}
        try:
            loggers.append(instantiate(sub, _convert_="all"))
        except InstantiationException as err:  # a typo in a logger option: name the logger, keep Hydra's reason
            raise ConfigError(f"logger {name!r} could not be created: {err}".replace("\n", " ")) from err
    return loggers


def log_config(loggers: list[Logger], resolved: dict) -> None:
    """The full resolved config as W&B run config (nested: optimizer.lr, data.batch_size, ... as in sweeps)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.log_hyperparams(resolved)


def finish_wandb(loggers: list[Logger], exit_code: int = 0) -> None:
    """Close the W&B run this process opened (train() may run again in the same process, e.g. in tests)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and getattr(logger, "_experiment", None) is not None:
            logger._experiment.finish(exit_code=exit_code)
            logger._experiment = None
