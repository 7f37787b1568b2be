"""The Hugging Face part of an export: transformer + tokenizer via `save_pretrained`, the `promptemb` record in
config.json, and the extra trained tensors (supervised head, OptiPrompt soft template) as safetensors files."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from promptemb.inference.prompt_encoder import PromptEncoder


def write_hf_directory(encoder: PromptEncoder, directory: Path) -> dict:
    """Write into an existing empty `directory`; return the promptemb record written to config.json."""
    record = encoder.record()
    encoder.transformer.save_pretrained(directory, safe_serialization=True)
    encoder.tokenizer.save_pretrained(directory)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["promptemb"] = record
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    head = record["pooler"]["head"]
    if head is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in encoder.head.state_dict().items()},
                  directory / head["file"])
    if record["soft_template"] is not None:
        save_file({"vectors": encoder.soft_template.vectors.detach().cpu().contiguous()},
                  directory / record["soft_template"]["file"])
    return record
