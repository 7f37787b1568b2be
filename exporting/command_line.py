"""`export.py` / `promptemb-export`: export a trained checkpoint, `promptemb-export ckpt_path=PATH output_dir=DIR
[pooler=avg] [score=true] [adapter=merge|keep] [format=auto|native|custom]`, or a plain model with a template,
`promptemb-export pretrained=NAME_OR_PATH output_dir=DIR [template=prompteol | template.text=...] [layer=-1]`.

DIR is both a Hugging Face model directory (AutoModel; template, pooler, layers and denoising in config.json's
`promptemb` block) and a sentence-transformers model: native modules (`SentenceTransformer(DIR)`) where they express
the pooling, else the custom module (`SentenceTransformer(DIR, trust_remote_code=True)`). Composed once and checked
once (common/cli.py).
"""

import sys

from promptemb.common.cli import check_command_line, run_command
from promptemb.common.run_context import RunContext


def checked(values: dict, context: RunContext):
    from promptemb.exporting.settings import ExportSettings

    return ExportSettings.model_validate(values, context=context)


def check_export_command(argv: list[str], composition_only: bool = False):
    """The settings `export.py ARGV` would export with, or its one-line refusal, without exporting."""
    return check_command_line("export", argv, checked, composition_only)


def run(settings, context: RunContext, _prepared=None) -> None:
    from promptemb.exporting.runner import export_checkpoint, export_model

    common = {"overwrite": settings.overwrite, "score": settings.score, "score_tasks": settings.score_tasks,
              "data_root": settings.data_root, "format": settings.format}
    if settings.pretrained:
        out = export_model(settings.pretrained, settings.output_dir, template=settings.template.text,
                           sentence_rule=settings.template.sentence_rule, pooler=settings.pooler,
                           layer=-1 if settings.layer is None else settings.layer, max_length=settings.max_length,
                           max_sentence_tokens=settings.max_sentence_tokens, padding_side=settings.padding_side,
                           **common)
    else:
        out = export_checkpoint(settings.ckpt_path, settings.output_dir, pooler=settings.pooler,
                                denoise=settings.denoise, base_model=settings.base_model, adapter=settings.adapter,
                                **common)
    print(f"exported to {out}")


def main() -> None:
    run_command("export", sys.argv[1:], checked, run)
