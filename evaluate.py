"""Score any encoder on STS, or embed a text file.

    python evaluate.py 'poolers=[mean,mask]' template=promptbert_bert
    python evaluate.py mode=encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
"""

import sys

import hydra
from omegaconf import DictConfig

from common.cli import check_command_line
from common.errors import exit_on_user_error
from evaluation.runner import run


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    exit_on_user_error(check_command_line)("evaluate", sys.argv[1:])
    main()
