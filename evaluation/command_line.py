"""`evaluate.py` / `promptemb-evaluate`: score any encoder on STS, transfer and clustering, or embed a text file.

    promptemb-evaluate 'poolers=[mean,mask]' template=promptbert_bert
    promptemb-evaluate backbone.name_or_path=RUN_DIR_OR_CKPT_OR_EXPORT    # a trained model, as training scored it
    promptemb-evaluate mode=encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
    promptemb-encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy    # the same (encode.yaml)
"""

import sys

import hydra
from omegaconf import DictConfig

from promptemb.common.cli import check_command_line, overrides_of
from promptemb.common.errors import exit_on_user_error
from promptemb.common.hydra_bridge import plain, running_context
from promptemb.common.run_folder import nothing_left_on_user_error
from promptemb.configs import CONFIG_DIR
from promptemb.evaluation.settings import EncodeSettings, EvaluateSettings


def check_then_run(cfg: DictConfig, settings_type: type[EvaluateSettings | EncodeSettings]):
    """evaluate.py's checked entry: the composed config becomes its command's settings, checked once before the
    scoring stack (torch, transformers, scikit-learn: most of a run's startup) is imported, so a wrong value costs a
    second, not ten; then `run` scores or encodes with them. A refused run leaves no run folder behind."""
    context = running_context()
    with nothing_left_on_user_error(context.run_dir):
        settings = settings_type.model_validate(plain(cfg), context=context)
        from promptemb.evaluation.runner import run

        return run(settings, context)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="eval")
@exit_on_user_error
def evaluate_task(cfg: DictConfig) -> None:
    check_then_run(cfg, EvaluateSettings)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="encode")
@exit_on_user_error
def encode_task(cfg: DictConfig) -> None:
    check_then_run(cfg, EncodeSettings)


def main() -> None:
    """evaluate.py: `mode=encode` is the encode command (configs/encode.yaml, whose `mode` key it is), anything else
    scores (configs/eval.yaml)."""
    if next((value for _, key, value in reversed(overrides_of(sys.argv[1:])) if key == "mode"), "score") == "encode":
        return encode_main()
    exit_on_user_error(check_command_line)("evaluate", sys.argv[1:], settings=EvaluateSettings)
    evaluate_task()


def encode_main() -> None:
    """`promptemb-encode`: evaluate.py's encode mode under its own name (configs/encode.yaml)."""
    exit_on_user_error(check_command_line)("encode", sys.argv[1:], settings=EncodeSettings)
    encode_task()
