"""export.py's settings (configs/export.yaml), checked once when they are built from the composed config: one of
`ckpt_path=` / `pretrained=`, and only the options that apply to it (one line, before any work)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import ValidationInfo, model_validator

from promptemb.common.cli import split_override
from promptemb.common.errors import ConfigError
from promptemb.common.validation import CommandSettings
from promptemb.encoder.settings import TemplateSettings
from promptemb.exporting.st_layout import ExportFormat

#: keys that describe how a plain `pretrained=` model is templated and pooled; a checkpoint carries its own
PLAIN_MODEL_KEYS = ("layer", "max_length", "max_sentence_tokens", "padding_side")


class ExportSettings(CommandSettings):
    described_as: ClassVar[str] = "export.py's config"

    ckpt_path: str | None
    pretrained: str | None
    output_dir: str | None
    pooler: str | None
    denoise: bool | None
    adapter: str | None
    layer: int | None
    max_length: int | None
    max_sentence_tokens: int | None
    padding_side: str | None
    overwrite: bool
    score: bool
    score_tasks: list[str]
    data_root: str | None
    base_model: str | None
    format: ExportFormat
    template: TemplateSettings

    @model_validator(mode="after")
    def check(self, info: ValidationInfo) -> ExportSettings:
        template = self.template
        given = {key for _, key, _ in map(split_override, getattr(info.context, "overrides", ()))}
        if not self.score:  # read only when the export is scored
            for key in ("score_tasks", "data_root"):
                if key in given:
                    raise ConfigError(f"{key}= is read when the export is scored: add score=true, or drop it")
        if self.ckpt_path and self.pretrained:
            raise ConfigError("pass ckpt_path=PATH (a trained checkpoint) or pretrained=NAME_OR_PATH (a plain model), "
                              "not both")
        if template.second_text is not None:
            raise ConfigError("template.second_text= is a second training view; an export has one template: use a "
                              "single template (template=NAME without _pair, or template.second_text=null)")
        if self.denoise and self.pooler == "avg":
            raise ConfigError("denoise=true subtracts the template bias from the [MASK] state; pooler=avg does not "
                              "pool it: drop denoise=")
        if self.pretrained:
            given = [key for key in ("adapter", "denoise", "base_model") if getattr(self, key) is not None]
            if given:
                raise ConfigError(f"{given[0]}= applies to ckpt_path= exports, not to a plain pretrained= model; drop "
                                  "it")
        else:
            given = ["template.text"] * (template.text is not None)
            given += [key for key in PLAIN_MODEL_KEYS if getattr(self, key) is not None]
            given += ["template.sentence_rule"] * (template.sentence_rule != "none")
            if given:
                raise ConfigError(f"{given[0]}= applies to a plain pretrained= export; a checkpoint exports the "
                                  "template, layer and lengths it was trained and scored with: drop it")
        return self
