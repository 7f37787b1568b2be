"""`evaluate.py` / `promptemb-evaluate`: score any encoder on STS, transfer and clustering, or embed a text file.

    promptemb-evaluate 'poolers=[mean,mask]' template=promptbert_bert
    promptemb-evaluate backbone.name_or_path=RUN_DIR_OR_CKPT_OR_EXPORT    # a trained model, as training scored it
    promptemb-evaluate mode=encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
    promptemb-encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy    # the same (encode.yaml)
"""

import sys
from collections.abc import Callable

import hydra
from omegaconf import DictConfig

from promptemb.common.cli import check_command_line, overrides_of
from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.common.hydra_bridge import plain, running_context
from promptemb.common.run_folder import nothing_left_on_user_error
from promptemb.configs import CONFIG_DIR
from promptemb.evaluation.settings import EvaluateSettings


def check_then_run(cfg: DictConfig):
    """evaluate.py's checked entry: the composed config becomes `EvaluateSettings`, checked once before the scoring
    stack (torch, transformers, scikit-learn: most of a run's startup) is imported, so a wrong value costs a second,
    not ten; then `run` scores or encodes with them. A refused run leaves no run folder behind."""
    context = running_context()
    with nothing_left_on_user_error(context.run_dir):
        settings = EvaluateSettings.model_validate(plain(cfg), context=context)
        from promptemb.evaluation.runner import run

        return run(settings, context)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="eval")
@exit_on_user_error
def evaluate_task(cfg: DictConfig) -> None:
    check_then_run(cfg)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="encode")
@exit_on_user_error
def encode_task(cfg: DictConfig) -> None:
    check_then_run(cfg)


#: Keys only one mode reads, and the key the other mode reads instead (None: nothing corresponds).
MODE_ONLY_KEYS = {
    "encode": {"pooler": "poolers=[NAME]", "input": None, "output": None},
    "score": {"poolers": "pooler=NAME", "post": None, "post_args": None, "tasks": None, "analysis": None,
              "transfer_args": None, "clustering_args": None, "dims": None},
}


def check_mode_keys(default_mode: str) -> Callable[[list[str]], None]:
    """The command-line check that refuses, in one line, a key of the other mode (`pooler=mask` in score mode is
    otherwise accepted and ignored: scoring reads `poolers`). `default_mode`: the mode the entry point's config
    sets when the command line does not."""

    def check(argv: list[str]) -> None:
        overrides = overrides_of(argv)
        mode = next((value for _, key, value in reversed(overrides) if key == "mode"), default_mode)
        for other_mode, keys in MODE_ONLY_KEYS.items():
            if other_mode == mode:
                continue
            for _, key, _ in overrides:
                key = key.split(".", 1)[0]  # `+transfer_args.batch_size=...` is a transfer_args key
                if key in keys:
                    instead = f"; in {mode} mode write {keys[key]}" if keys[key] else ""
                    raise ConfigError(f"{key}= is read in {other_mode} mode only and this is {mode} mode (it "
                                      f"would be ignored){instead}")

    return check


def main() -> None:
    exit_on_user_error(check_command_line)("evaluate", sys.argv[1:], check_mode_keys("score"),
                                           settings=EvaluateSettings)
    evaluate_task()


def encode_main() -> None:
    """`promptemb-encode`: evaluate.py's encode mode under its own name (configs/encode.yaml)."""
    exit_on_user_error(check_command_line)("encode", sys.argv[1:], check_mode_keys("encode"),
                                           settings=EvaluateSettings)
    encode_task()
