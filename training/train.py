"""`train.py` / `promptemb-train`: train a prompt-based sentence encoder (`promptemb-train experiment=NAME`).

Hydra names the job after this module (`train`), so the run folder's log is train.log whichever way it is started.
"""

import sys

import hydra
from omegaconf import DictConfig

from promptemb.common.cli import check_command_line
from promptemb.common.errors import exit_on_user_error
from promptemb.configs import CONFIG_DIR
from promptemb.training.command_line import check_experiment_overrides, check_override_keys
from promptemb.training.preflight import check_run_before_hydra
from promptemb.training.runner import run


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
@exit_on_user_error
def compose_and_run(cfg: DictConfig) -> float | None:
    """Returns the best STS-B dev [MASK] score (the objective of sweeps)."""
    return run(cfg)


def main() -> None:
    exit_on_user_error(check_command_line)("train", sys.argv[1:], check_experiment_overrides, check_override_keys,
                                           check_run_before_hydra)
    compose_and_run()
