"""`export.py` / `promptemb-export`: export a trained checkpoint, `promptemb-export ckpt=PATH.ckpt out=DIR [pooler=avg]
[score=true] [adapter=merge|keep] [format=auto|native|custom]`, or a plain model with a template, `promptemb-export
pretrained=NAME_OR_PATH out=DIR [template=prompteol | template.text=...] [layer=-1]`.

DIR is both a Hugging Face model directory (AutoModel; template, pooler, layers and denoising in config.json's
`promptemb` block) and a sentence-transformers model: native modules (`SentenceTransformer(DIR)`) where they express
the pooling, else the custom module (`SentenceTransformer(DIR, trust_remote_code=True)`).
"""

import sys

import hydra
from omegaconf import DictConfig

from promptemb.common.cli import check_command_line, overrides_of
from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.common.hydra_bridge import plain
from promptemb.configs import CONFIG_DIR
from promptemb.exporting.runner import export_checkpoint, export_model
from promptemb.exporting.settings import ExportSettings


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="export")
@exit_on_user_error
def export_task(cfg: DictConfig) -> None:
    settings = ExportSettings.model_validate(plain(cfg))
    common = {"overwrite": settings.overwrite, "score": settings.score, "score_tasks": settings.score_tasks,
              "data_root": settings.data_root, "format": settings.format}
    if settings.pretrained:
        text, rule = settings.template.text, settings.template.sentence_rule
        out = export_model(settings.pretrained, settings.out, template=text,
                           sentence_rule=None if text is None and rule == "none" else rule, pooler=settings.pooler,
                           layer=-1 if settings.layer is None else settings.layer, max_length=settings.max_length,
                           max_sentence_tokens=settings.max_sentence_tokens, padding_side=settings.padding_side,
                           **common)
    else:
        out = export_checkpoint(settings.ckpt, settings.out, pooler=settings.pooler, denoise=settings.denoise,
                                base_model=settings.base_model, adapter=settings.adapter, **common)
    print(f"exported to {out}")


def check_score_keys(argv: list[str]) -> None:
    """`score_tasks=` / `data_root=` only matter when the export is scored (`score=true`)."""
    given = {key: value for _, key, value in overrides_of(argv)}
    if given.get("score", "false").lower() != "true":
        for key in ("score_tasks", "data_root"):
            if key in given:
                raise ConfigError(f"{key}= is read when the export is scored: add score=true, or drop it")


def main() -> None:
    exit_on_user_error(check_command_line)("export", sys.argv[1:], check_score_keys, settings=ExportSettings)
    export_task()
