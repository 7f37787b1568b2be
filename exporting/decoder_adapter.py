"""A trained PromptEOLSup module written from Python (export.py writes the full export directory of any checkpoint:
exporting/runner.py): `merged` (LoRA folded into the base weights: a plain Hugging Face model directory any tool
loads) or `adapter` (peft's adapter files naming the base model), each with the tokenizer and
`promptemb_decoder.json` (template, sentence rule, pooling); `load_merged_export` reads a merged one back."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoModel, AutoTokenizer

from promptemb.common.errors import ConfigError
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.lightning_modules.prompteol import PromptEOLSup, merged_copy
from promptemb.poolers.decoder import LastTokenPooler

EXPORT_MODES = ("merged", "adapter")
RECORD_FILE = "promptemb_decoder.json"


def export_adapter(module: PromptEOLSup, out: str | Path, mode: str = "merged") -> Path:
    """Write `module` to `out` as `mode` (merged | adapter); the module itself stays unmerged."""
    if mode not in EXPORT_MODES:
        raise ConfigError(f"unknown export mode {mode!r}; valid: {', '.join(EXPORT_MODES)}")
    if module.hparams.quantization is not None and mode == "merged":
        raise ConfigError("a 4-bit (QLoRA) base cannot be merged exactly; export with mode=adapter")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if mode == "merged":
        merged_copy(module).save_pretrained(out)
    else:
        module.transformer.save_pretrained(out)
    module.tokenizer.save_pretrained(out)
    record = {"mode": mode, "base_model": module.hparams.model_name_or_path,
              "base_weights_sha256": module.base_weights_sha256, "template": module.eval_template.text,
              "sentence_rule": module.hparams.sentence_rule, "pooler": "last_token", "layer": -1,
              "max_sentence_tokens": module.hparams.max_sentence_tokens, "padding_side": module.hparams.padding_side}
    (out / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return out


def load_merged_export(directory: str | Path) -> tuple[Encoder, LastTokenPooler, InputForm]:
    """(encoder, pooler, input form) of a merged export, ready for `Encoder.encode_form`."""
    directory = Path(directory)
    record_path = directory / RECORD_FILE
    if not record_path.is_file():
        raise ConfigError(f"{directory} is not a PromptEOLSup export (no {RECORD_FILE})")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if record["mode"] != "merged":
        raise ConfigError(f"{directory} holds an adapter; load it with load_adapter_checkpoint or peft")
    transformer = AutoModel.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    encoder = Encoder.from_model(transformer, tokenizer, name=str(directory), padding_side=record["padding_side"])
    form = InputForm(Template(record["template"]), record["sentence_rule"], record["max_sentence_tokens"])
    return encoder, LastTokenPooler("last_token", layer=record["layer"]), form
