"""`evaluate.py` / `promptemb-evaluate`: score any encoder on STS, or embed a text file.

    promptemb-evaluate 'poolers=[mean,mask]' prompt=promptbert_bert
    promptemb-evaluate model.name_or_path=RUN_DIR_OR_CKPT_OR_EXPORT    # a trained model, as training scored it
    promptemb-evaluate mode=encode model.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
"""

import sys

import hydra
from omegaconf import DictConfig

from common.cli import quote_free_text_overrides
from common.errors import exit_on_user_error
from common.validation import check_run_dir_before_hydra
from configs import CONFIG_DIR
from evaluation.runner import run


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
@exit_on_user_error
def compose_and_run(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    sys.argv = quote_free_text_overrides(sys.argv)
    exit_on_user_error(check_run_dir_before_hydra)("evaluate", sys.argv[1:])
    compose_and_run()
