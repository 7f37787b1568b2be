"""Train a prompt-based sentence encoder: `python train.py experiment=promptbert_unsup [trainer=gpu]`."""

import sys

import hydra
from omegaconf import DictConfig

from common.cli import quote_free_text_overrides
from common.errors import exit_on_user_error
from common.validation import check_run_dir_before_hydra
from training.runner import check_experiment_overrides, check_override_keys, run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    """Returns the best STS-B dev [MASK] score (the objective of sweeps)."""
    return run(cfg)


if __name__ == "__main__":
    exit_on_user_error(check_experiment_overrides)(sys.argv[1:])
    sys.argv = quote_free_text_overrides(sys.argv)
    exit_on_user_error(check_override_keys)(sys.argv[1:])
    exit_on_user_error(check_run_dir_before_hydra)("train", sys.argv[1:])
    main()
