"""Train a prompt-based sentence encoder: `python train.py experiment=promptbert_unsup [trainer=gpu] [debug=fdr]`."""

import sys

import hydra
from omegaconf import DictConfig

from common.cli import check_command_line
from common.errors import exit_on_user_error
from training.runner import run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    """Returns the best STS-B dev [MASK] score (the objective of sweeps)."""
    return run(cfg)


if __name__ == "__main__":
    exit_on_user_error(check_command_line)("train", sys.argv[1:])
    main()
