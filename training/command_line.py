"""`train.py` / `promptemb-train`: train a prompt-based sentence encoder (`promptemb-train experiment=NAME`).

The command line is composed once and checked once (common/cli.py) into `TrainSettings`; a single run then takes its
folder (training/run_folder.py: a resume's checkpoint and lineage, the folder's lock) before Hydra's job writes into
it, and trains in it with its outcome recorded. Under `-m` every job is checked and trained in its own folder, a
refused or failed job recorded as that trial's failure. `hparams_search=...` runs an Optuna study instead, each trial
composed and trained in its own folder. Hydra's job name is `train` (configs/train.yaml), so the run folder's log is
train.log whichever way the command is started."""

from __future__ import annotations

import contextlib
import sys

from promptemb.common.cli import check_command_line, group_options, run_command, split_override
from promptemb.common.errors import ConfigError, exit_with
from promptemb.common.hydra_bridge import compose, compose_config, plain
from promptemb.common.run_context import RunContext
from promptemb.training import run_folder  # registers the `promptemb.run_dir` resolver before anything composes

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


def check_train_only_keys(overrides) -> None:
    """A command-line key that training would accept and not read: `backbone.*` keys other than the model's name
    (evaluate.py's; training builds the model from `backbone.name_or_path` only) and the `UNREAD_KEYS`. One line
    naming what does it instead."""
    for _, key, _ in map(split_override, overrides or ()):
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


def checked(values, context: RunContext | None = None):
    """The composed config's one check, into `TrainSettings` (what it needs is imported here: a mistake is answered
    without loading the training stack); `values` plain, or a config composed in Python (`compose_train`)."""
    from promptemb.training.settings import TrainSettings

    return TrainSettings.model_validate(values if isinstance(values, dict) else plain(values), context=context)


def compose_train(overrides: list[str]):
    """train.py's config as Hydra composes it for these overrides, for a run from Python:
    `train(checked(compose_train([...])))`."""
    return compose_config("train", overrides)


def check_train_command(argv: list[str], composition_only: bool = False):
    """The settings `train.py ARGV` would train with, or its one-line refusal, without training."""
    return check_command_line("train", argv, checked, composition_only, precheck=check_train_only_keys)


def take_folder(settings, context: RunContext) -> contextlib.AbstractContextManager:
    """A single run takes its folder before Hydra's job writes into it; a study's trials take their own."""
    return contextlib.nullcontext() if settings.hparams_search else run_folder.take(settings, context)


def run(settings, context: RunContext, taken) -> float | None:
    """One run in the folder it took, its outcome recorded; or an Optuna study. Returns the objective of sweeps."""
    if settings.hparams_search:
        from promptemb.training.optuna_search import run_study

        return run_study(settings, context, train_trial)
    from promptemb.training.runner import run_in_folder

    return run_in_folder(settings, context, taken)


def sweep_job(values: dict, context: RunContext) -> float | None:
    """One job of `-m`: a refusal is recorded as that trial's failure (in its job folder) and the sweep goes on;
    Ctrl-C ends the whole sweep here, with its one line (Hydra would record the job's exception and launch the rest
    of the batch first)."""
    try:
        with run_folder.outcome(context.job_dir, context) as result:
            settings = checked(values, context)
            if settings.hparams_search:
                result.objective = run(settings, context, None)
            else:
                with run_folder.take(settings, context) as taken:
                    result.objective = _train(settings, context, taken)
    except run_folder.RunInterruptedError as err:
        exit_with(err)
    return result.objective


def _train(settings, context: RunContext, taken) -> float | None:
    from promptemb.training.runner import best_dev_score, train

    return best_dev_score(train(settings, context, taken))


def train_trial(overrides: list[str], context: RunContext) -> float | None:
    """One trial of an Optuna search: train.py's config with the trial's overrides, checked and trained (its
    composition is the trial's own)."""
    return _train(checked(compose("train", overrides), context), context, None)


def experiment_names() -> list[str]:
    return group_options("experiment")


def main() -> None:
    run_command("train", sys.argv[1:], checked, run, prepare=take_folder, sweep_job=sweep_job,
                precheck=check_train_only_keys)
