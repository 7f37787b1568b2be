"""Instantiate everything from the composed config and fit (final STS scoring happens in the callback)."""

from __future__ import annotations

import difflib
import logging
import re
import warnings
from pathlib import Path

import pytorch_lightning as pl
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.callbacks.wandb_run import WandbRunCallback
from promptemb.common.errors import ConfigError, PreemptedError, UserError
from promptemb.common.validation import check_train_config
from promptemb.configs import CONFIG_DIR
from promptemb.data.root import resolve_data_root
from promptemb.exporting.runner import check_out, export_checkpoint
from promptemb.lightning_modules.checkpoint import read_checkpoint
from promptemb.training.loggers import build_loggers, finish_wandb, log_config
from promptemb.training.optuna_search import run_study
from promptemb.training.rng_state import RandomStateCallback
from promptemb.training.run_dirs import in_multirun, resume_checkpoint
from promptemb.training.trials import run_trial
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)
MULTIRUN_FLAGS = ("-m", "--multirun")


def compose_train(overrides: list[str]) -> DictConfig:
    """train.py's config as Hydra composes it for these overrides (no run, no output directory)."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def build_module(cfg: DictConfig) -> pl.LightningModule:
    """The recipe (`model`) with the configured optimiser and schedule (`optimizer`, `scheduler`: Hydra partials)."""
    return build(cfg.model, optimizer=build(cfg.optimizer), scheduler=build(cfg.scheduler))


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


def parse_overrides(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides)


def sweep_values(override) -> list[str]:
    """The values a parsed multirun override sweeps over (`a,b`, `choice(a,b)`, `range(...)`); [] when not a sweep
    or not enumerable (Optuna's `interval(...)`)."""
    if not override.is_sweep_override():
        return []
    try:
        return list(override.sweep_string_iterator())
    except Exception:  # interval sweeps have no values to list
        return []


def build(node, **kwargs):
    """`hydra.utils.instantiate` with `_convert_="all"`; a user mistake raised inside a constructor comes out as
    that one-line `UserError`, not wrapped in Hydra's multi-line InstantiationException."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        while cause is not None and not isinstance(cause, UserError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


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


def first_of_sweeps(overrides: list[str]) -> list[str]:
    """Multirun overrides as one job's: each sweep (`a=1,2`, `range(...)`, `choice(...)`) replaced by its first
    value; sweeps without one (Optuna's `interval(...)`) are left out of the check."""
    single = []
    for override in parse_overrides(overrides):
        if not override.is_sweep_override():
            single.append(override.input_line)
        elif values := sweep_values(override):
            single.append(f"{override.get_key_element()}={values[0]}")
    return single


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


def best_dev_score(trainer: pl.Trainer) -> float | None:
    """The monitored dev score of the best checkpoint (= the last `val/stsb_dev/mask_best`); without one (training
    ended before the first evaluation after step 0), the untrained model's step-0 score, so the objective exists."""
    best = getattr(trainer.checkpoint_callback, "best_model_score", None)
    if best is not None:
        return float(best)
    callback = next((c for c in trainer.callbacks if isinstance(c, STSEvaluationCallback)), None)
    return callback.best_selection_score(include_untrained=True) if callback else None


def objective(cfg: DictConfig) -> float | None:
    return best_dev_score(train(cfg))


def apply_extras(cfg: DictConfig) -> None:
    """configs/extras/: silence warnings, log the composed config."""
    extras = cfg.get("extras") or {}
    if extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))


def run(cfg: DictConfig) -> float | None:
    """train.py's task: an Optuna search when `hparams_search` is set, else one run (a trial when under -m).
    Returns the objective, the best STS-B dev [MASK] score (for Hydra's sweepers)."""
    if cfg.get("hparams_search"):
        return run_study(cfg, objective)
    return run_trial(cfg, objective, in_sweep=in_multirun()).objective


def train(cfg: DictConfig) -> pl.Trainer:
    check_train_config(cfg)  # types, ranges, devices, paths, weights, data columns: before any model or data loads
    apply_extras(cfg)
    resolve_data_root(cfg.data_root)  # evaluation needs it; fail before loading any model
    checkpoint = resume_checkpoint(cfg.ckpt_path, bool(cfg.get("resume", False)),
                                   Path(cfg.paths.log_dir) / cfg.task_name)
    # a missing, damaged or foreign checkpoint: one line now, not a traceback from Lightning
    resume = read_checkpoint(checkpoint, argument="ckpt_path") if checkpoint else None
    if checkpoint:
        log.info("resuming from %s (step %s) into %s", checkpoint, resume.get("global_step"), cfg.output_dir)
    export_dir = cfg.get("export_dir")
    if export_dir:
        check_out(Path(export_dir), overwrite=False)  # fail before training, not after
    # W&B: credentials checked and the resumed run id taken from the checkpoint before any run is created.
    loggers = build_loggers(cfg.get("logger"), resume)
    del resume  # only its header was needed; Lightning loads the checkpoint itself
    pl.seed_everything(int(cfg.seed), workers=True)
    # _convert_="all": modules get plain lists/dicts, so checkpoints hold no OmegaConf objects and load with
    # torch.load(weights_only=True).
    datamodule = build(cfg.data)
    module = build_module(cfg)
    callbacks = [build(c) for c in cfg.callbacks.values() if c is not None]
    callbacks.append(RandomStateCallback())  # exact resume: dropout draws continue where the checkpoint left them
    for callback in callbacks:
        if isinstance(callback, STSEvaluationCallback):
            callback.provenance.update(seed=int(cfg.seed), config=OmegaConf.to_container(cfg, resolve=True),
                                       held_out_tasks=list(getattr(datamodule, "held_out_tasks", ())))
    if any(isinstance(lg, WandbLogger) for lg in loggers):
        callbacks.append(WandbRunCallback())
    trainer: pl.Trainer = build(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    log_config(loggers, cfg)
    exit_code = 1
    try:
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(checkpoint) if checkpoint else None)
        except SIGTERMException:
            raise PreemptedError(f"preempted (SIGTERM) at step {trainer.global_step}: saved "
                            f"{trainer.checkpoint_callback.last_model_path}; resume with the same command plus "
                            "ckpt_path=last (or ckpt_path=PATH of that file)") from None
        exit_code = 0
    finally:
        finish_wandb(loggers, exit_code)
    sts = next((c for c in callbacks if isinstance(c, STSEvaluationCallback)), None)
    if trainer.is_global_zero and sts is not None and (line := sts.summary()):
        log.warning(line) if "WARNING" in line else log.info(line)
    if export_dir and trainer.is_global_zero and not trainer.interrupted:
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        if not best:
            raise ConfigError("export_dir is set but no checkpoint was saved; train for at least eval_every_n_steps")
        log.info("exported %s to %s", best, export_checkpoint(best, export_dir))
    return trainer
