"""Score any encoder on STS, or embed a text file.

    python evaluate.py 'poolers=[mean,mask]' prompt=promptbert_bert
    python evaluate.py mode=encode model.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
"""

import sys

import hydra
from omegaconf import DictConfig

from common.cli import quote_free_text_overrides
from common.errors import exit_on_user_error
from common.validation import check_run_dir_before_hydra
from evaluation.runner import run


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    sys.argv = quote_free_text_overrides(sys.argv)
    exit_on_user_error(check_run_dir_before_hydra)("evaluate", sys.argv[1:])
    main()
