"""`evaluate.py` / `promptemb-evaluate`: score any encoder on STS, transfer and clustering, or embed a text file.

    promptemb-evaluate 'poolers=[mean,mask]' template=promptbert_bert
    promptemb-evaluate backbone.name_or_path=RUN_DIR_OR_CKPT_OR_EXPORT    # a trained model, as training scored it
    promptemb-evaluate mode=encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy
    promptemb-encode backbone.name_or_path=DIR pooler=mean input=FILE.txt output=FILE.npy    # the same (encode.yaml)

Composed once and checked once (common/cli.py) into `EvaluateSettings` / `EncodeSettings` before the scoring stack is
imported, so a wrong value costs a second, not ten; a run refused after Hydra made its folder leaves none behind.
"""

import sys

from promptemb.common.cli import check_command_line, overrides_of, run_command
from promptemb.common.run_context import RunContext
from promptemb.common.run_folder import nothing_left_on_user_error


def checked(settings_type_name: str):
    def check(values: dict, context: RunContext):
        from promptemb.evaluation import settings

        return getattr(settings, settings_type_name).model_validate(values, context=context)
    return check


def check_evaluate_command(argv: list[str], entry: str = "evaluate", composition_only: bool = False):
    """The settings `evaluate.py ARGV` (or `promptemb-encode ARGV`: entry="encode") would run with, or its one-line
    refusal, without running."""
    return check_command_line(entry, argv, checked("EvaluateSettings" if entry == "evaluate" else "EncodeSettings"),
                              composition_only)


def run(settings, context: RunContext, _prepared=None):
    with nothing_left_on_user_error(context.run_dir):
        from promptemb.inference.runner import run as run_evaluation

        return run_evaluation(settings, context)


def main() -> None:
    """evaluate.py: `mode=encode` is the encode command (configs/encode.yaml, whose `mode` key it is), anything else
    scores (configs/eval.yaml)."""
    if next((value for _, key, value in reversed(overrides_of(sys.argv[1:])) if key == "mode"), "score") == "encode":
        return encode_main()
    run_command("evaluate", sys.argv[1:], checked("EvaluateSettings"), run)


def encode_main() -> None:
    """`promptemb-encode`: evaluate.py's encode mode under its own name (configs/encode.yaml)."""
    run_command("encode", sys.argv[1:], checked("EncodeSettings"), run)
