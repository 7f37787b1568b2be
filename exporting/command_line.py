"""`export.py` / `promptemb-export`: export a trained checkpoint, `promptemb-export ckpt=PATH.ckpt out=DIR [pooler=avg]
[score=true] [adapter=merge|keep]`, or a plain model with a template, `promptemb-export pretrained=NAME_OR_PATH out=DIR
[template=prompteol | template.text=...] [layer=-1]`.

DIR is both a Hugging Face model directory (AutoModel; template, pooler, layers and denoising in config.json's
`promptemb` block) and a sentence-transformers model (`SentenceTransformer(DIR, trust_remote_code=True)`).
"""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from promptemb.common.cli import check_command_line, split_override
from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.configs import CONFIG_DIR
from promptemb.exporting.runner import export_checkpoint, export_model

#: keys that describe how a plain `pretrained=` model is templated and pooled; a checkpoint carries its own
PLAIN_MODEL_KEYS = ("template.text", "layer", "max_length", "max_sentence_tokens", "padding_side")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="export")
@exit_on_user_error
def compose_and_export(cfg: DictConfig) -> None:
    check_sources(cfg)
    common = {"overwrite": bool(cfg.overwrite), "score": bool(cfg.score), "score_tasks": list(cfg.score_tasks),
              "data_root": cfg.data_root}
    if cfg.pretrained:
        rule = cfg.template.sentence_rule
        out = export_model(cfg.pretrained, cfg.out, template=cfg.template.text,
                           sentence_rule=None if cfg.template.text is None and rule == "none" else rule,
                           pooler=cfg.pooler, layer=-1 if cfg.layer is None else int(cfg.layer),
                           max_length=cfg.max_length, max_sentence_tokens=cfg.max_sentence_tokens,
                           padding_side=cfg.padding_side, **common)
    else:
        out = export_checkpoint(cfg.ckpt, cfg.out, pooler=cfg.pooler, denoise=cfg.denoise,
                                base_model=cfg.base_model, adapter=cfg.adapter, **common)
    print(f"exported to {out}")


def check_sources(cfg: DictConfig) -> None:
    """One of ckpt= / pretrained=, and only the options that apply to it (one line, before any work)."""
    if cfg.ckpt and cfg.pretrained:
        raise ConfigError("pass ckpt=PATH (a trained checkpoint) or pretrained=NAME_OR_PATH (a plain model), not "
                          "both")
    if OmegaConf.select(cfg, "template.second_text") is not None:
        raise ConfigError("template.second_text= is a second training view; an export has one template: use a single "
                          "template (template=NAME without _pair, or template.second_text=null)")
    if cfg.denoise and cfg.pooler == "avg":
        raise ConfigError("denoise=true subtracts the template bias from the [MASK] state; pooler=avg does not pool "
                          "it: drop denoise=")
    if cfg.pretrained:
        given = [key for key in ("adapter", "denoise", "base_model") if cfg.get(key) is not None]
        if given:
            raise ConfigError(f"{given[0]}= applies to ckpt= exports, not to a plain pretrained= model; drop it")
    else:
        given = [key for key in PLAIN_MODEL_KEYS if OmegaConf.select(cfg, key) is not None]
        if OmegaConf.select(cfg, "template.sentence_rule") not in (None, "none"):
            given.append("template.sentence_rule")
        if given:
            raise ConfigError(f"{given[0]}= applies to a plain pretrained= export; a checkpoint exports the "
                              "template, layer and lengths it was trained and scored with: drop it")


def check_score_keys(argv: list[str]) -> None:
    """`score_tasks=` / `data_root=` only matter when the export is scored (`score=true`)."""
    given = {key: value for _, key, value in (split_override(arg) for arg in argv if "=" in arg and arg[0] != "-")}
    if given.get("score", "false").lower() != "true":
        for key in ("score_tasks", "data_root"):
            if key in given:
                raise ConfigError(f"{key}= is read when the export is scored: add score=true, or drop it")


def main() -> None:
    exit_on_user_error(check_command_line)("export", sys.argv[1:], check_score_keys)
    compose_and_export()
