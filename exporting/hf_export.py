"""The Hugging Face part of an export: transformer + tokenizer via `save_pretrained`, the `promptemb` record in
config.json, and the extra trained tensors (supervised head, OptiPrompt soft template, DCPCSE
prefixes) as safetensors files. A decoder
that keeps its LoRA adapter writes the base model's config.json (no base weights: the record names the base model and
its weights sha256) and peft's adapter files in `adapter/`."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from promptemb.inference.prompt_encoder import PromptEncoder, weight_files_sha256


def write_hf_directory(encoder: PromptEncoder, directory: Path, sentence_transformers: dict) -> dict:
    """Write into an existing `directory` (empty, or holding the export's sentence-transformers files); return the
    promptemb record written to config.json: the encoder's record, `sentence_transformers` (which layout the export
    has and why: exporting/st_layout.py) and the sha256 of every weight file in `directory`, computed last so that
    it covers them all (a native Dense module's weights included)."""
    record = {**encoder.record(), "sentence_transformers": sentence_transformers}
    if encoder.adapter is not None:  # a peft model: its adapter files, and the base model's config
        encoder.transformer.save_pretrained(directory / encoder.adapter["dir"], safe_serialization=True)
        encoder.transformer.get_base_model().config.save_pretrained(directory)
    else:
        encoder.transformer.save_pretrained(directory, safe_serialization=True)
    encoder.tokenizer.save_pretrained(directory)
    head = record["pooler"]["head"]
    if head is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in encoder.head.state_dict().items()},
                  directory / head["file"])
    if record["soft_template"] is not None:
        save_file({"vectors": encoder.soft_template.vectors.detach().cpu().contiguous()},
                  directory / record["soft_template"]["file"])
    if record.get("deep_prompt") is not None:
        encoder.deep_prompt.save(directory)
    record["weights_sha256"] = weight_files_sha256(directory)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["promptemb"] = record
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return record
