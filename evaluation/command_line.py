"""`evaluate.py` / `promptemb-evaluate`: score any encoder on STS, transfer and clustering, or embed a text file.

    promptemb-evaluate 'poolers=[mean,mask]' template=promptbert_bert
    promptemb-evaluate backbone.name_or_path=RUN_DIR_OR_CKPT_OR_EXPORT    # a trained model, as training scored it
    promptemb-evaluate mode=encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
    promptemb-encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy    # the same (encode.yaml)
"""

import sys

import hydra
from omegaconf import DictConfig

from promptemb.common.cli import check_command_line
from promptemb.common.errors import exit_on_user_error
from promptemb.configs import CONFIG_DIR
from promptemb.evaluation.config_checks import check_evaluate_config


def check_then_run(cfg: DictConfig) -> None:
    """A mistake in the config is reported before the scoring stack (torch, transformers, scikit-learn: most of a
    run's startup) is imported, so a wrong value costs a second, not ten."""
    check_evaluate_config(cfg)
    from promptemb.evaluation.runner import run

    run(cfg)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="eval")
@exit_on_user_error
def compose_and_run(cfg: DictConfig) -> None:
    check_then_run(cfg)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="encode")
@exit_on_user_error
def compose_and_encode(cfg: DictConfig) -> None:
    check_then_run(cfg)


def main() -> None:
    exit_on_user_error(check_command_line)("evaluate", sys.argv[1:])
    compose_and_run()


def encode_main() -> None:
    """`promptemb-encode`: evaluate.py's encode mode under its own name (configs/encode.yaml)."""
    exit_on_user_error(check_command_line)("evaluate", sys.argv[1:])
    compose_and_encode()
