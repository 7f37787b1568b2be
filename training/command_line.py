"""`train.py` / `promptemb-train`: train a prompt-based sentence encoder (`promptemb-train experiment=NAME`).

The command line is checked before Hydra composes it: a `backbone.*` key that training would ignore is refused
(unknown keys, experiments and other options, every value of a sweep included: common/cli.py). Hydra's job name is
set to `train` in configs/train.yaml, so the run folder's log is train.log whichever way the command is started."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig

from promptemb.common import cli
from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.common.hydra_bridge import compose, compose_config, plain, resolved_values, running_context
from promptemb.common.run_context import FROM_PYTHON, RunContext
from promptemb.common.run_folder import nothing_left_on_user_error
from promptemb.configs import CONFIG_DIR
from promptemb.training.guards import Preflight, preflight
from promptemb.training.optuna_search import run_study
from promptemb.training.run_lock import first_process_of_job
from promptemb.training.runner import best_dev_score, train
from promptemb.training.settings import TrainSettings
from promptemb.training.trials import before_the_run, trial


@dataclass
class CheckedBeforeHydra:
    """A resume, or a run into an existing folder: the settings and the preflight the command line ran before Hydra
    wrote into the folder, handed to the task instead of checked again."""

    settings: TrainSettings
    checks: Preflight


def train_task(cfg: DictConfig, before: CheckedBeforeHydra | None = None) -> float | None:
    """Hydra's task (lightning-hydra-template's `main`): the composed config checked into `TrainSettings`, then one
    `train` as a trial (its outcome recorded in its run folder; under -m a failed trial does not stop the sweep), or
    an Optuna search when `hparams_search` is set (each trial one `train`). Returns the best STS-B dev [MASK] score,
    the objective of sweeps."""
    context = running_context()
    if before is not None and before.settings.resolved != plain(cfg):  # Hydra composed other values (a timestamp)
        before = None
    if cfg.get("hparams_search"):
        with nothing_left_on_user_error(context.run_dir):  # a refused study leaves no folder behind
            settings = before.settings if before else checked(cfg)
        return run_study(settings, context, train_trial)
    with trial(cfg.output_dir, context) as outcome:
        settings = before.settings if before else checked(cfg)
        outcome.objective = best_dev_score(train(settings, context, before.checks if before else None))
    return outcome.objective


def checked(cfg: DictConfig | dict) -> TrainSettings:
    """The composed config's one check; a refusal comes before the run takes its folder (which stays as it was)."""
    with before_the_run():
        return TrainSettings.model_validate(plain(cfg))


def train_trial(overrides: list[str], context: RunContext) -> float | None:
    """One trial of an Optuna search: train.py's config with the trial's overrides, checked and trained."""
    return best_dev_score(train(checked(compose("train", overrides, resolve=False)), context))


def compose_train(overrides: list[str]) -> DictConfig:
    """train.py's config as Hydra composes it for these overrides (no run, no output directory)."""
    return compose_config("train", overrides)


def experiment_names() -> list[str]:
    return cli.group_options("experiment")


def check_train_only_keys(argv: list[str]) -> None:
    """`backbone.*` keys other than the model's name are evaluate.py's: training builds the model from
    `backbone.name_or_path` only, so such an override would be accepted and ignored. One line naming the key that
    does it instead."""
    for _, key, _ in cli.overrides_of(argv):
        group, dot, leaf = key.partition(".")
        unread = next((reason for name, reason in UNREAD_KEYS.items() if key == name or key.startswith(name + ".")),
                      None)
        if unread:
            raise ConfigError(f"train.py does not read {key}: {unread}")
        if group == "backbone" and dot and leaf != "name_or_path":
            instead = TRAINING_EQUIVALENTS.get(leaf)
            advice = f"set {instead} instead" if instead else "drop it (evaluate.py reads it, train.py does not)"
            raise ConfigError(f"train.py does not read {key} (training takes only backbone.name_or_path from the "
                              f"backbone); {advice}")


#: Keys of train.py's config that nothing reads, and why.
UNREAD_KEYS = {
    "trainer.limit_val_batches": "there is no validation loop (the STS callback scores the dev set every "
                                 "eval_every_n_steps); drop it",
    "trainer.num_sanity_val_steps": "there is no validation loop; drop it",
    "trainer.default_root_dir": "checkpoints and logs have their own folders under output_dir; set output_dir",
    "logger.resume_step": "a resumed run sets it from its checkpoint; drop it",
    "expected_scores": "`make reproduce` reads the pinned scores from the experiment's file "
                       "(configs/experiment/NAME.yaml); edit them there",
}

#: What training reads in place of a backbone key evaluate.py reads.
TRAINING_EQUIVALENTS = {"max_length": "+model.max_length=N (the templated input's token limit)",
                        "batch_size": "data.batch_size", "device": "trainer.accelerator / trainer.devices",
                        "dtype": "trainer.precision (model.dtype: a decoder recipe's base weights)",
                        "quantization": "model.quantization=4bit (QLoRA in the decoder recipe prompteol_sup)"}


def check_run_before_hydra(argv: list[str]) -> CheckedBeforeHydra | None:
    """The preflight refusals (training/guards.py) before Hydra touches an existing run folder: for a resume or a
    run into a folder that exists, the config is composed and checked here, and those settings and that preflight are
    the ones the task trains with (one check and one preflight per command). A fresh run into a new folder has
    nothing to protect; flags (-m, --cfg, ...) are left to Hydra and each trial of a sweep has a folder of its own."""
    if any(arg.startswith("-") for arg in argv) or not first_process_of_job():
        return None
    try:
        composed = compose("train", argv, resolve=False)
        ckpt_path, resume, output_dir = resolved_values(composed, "ckpt_path", "resume", "output_dir")
    except Exception:  # overrides that do not compose: Hydra reports them
        return None
    if ckpt_path not in (None, "", "null") or resume or Path(output_dir).exists():
        settings = TrainSettings.model_validate(plain(composed))
        return CheckedBeforeHydra(settings, preflight(settings, FROM_PYTHON))
    return None


def main() -> None:
    """train.py / promptemb-train: the command line checked before Hydra composes the config and creates the run
    folder (one `error:` line), then Hydra runs `train_task` (with what was checked before it, if anything)."""
    argv = sys.argv[1:]
    exit_on_user_error(cli.check_command_line)("train", argv, check_train_only_keys,
                                                settings=TrainSettings)
    before = exit_on_user_error(check_run_before_hydra)(argv)

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
    @exit_on_user_error
    def task(cfg: DictConfig) -> float | None:
        return train_task(cfg, before)

    task()
