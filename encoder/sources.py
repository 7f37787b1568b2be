"""What a model name or path points at, read from the file system alone (no model is loaded): a train.py checkpoint,
a run folder, an export directory (config.json with a `promptemb` block), or a plain pretrained model."""

from __future__ import annotations

import json
from pathlib import Path

from promptemb.common.errors import DataError

CHECKPOINT_DIR = "checkpoints"
RUN_STATUS = "status.json"  # what train.py writes into every run folder it keeps (training/run_folder.py)


def export_block(directory: Path) -> dict | None:
    """The `promptemb` block of `directory/config.json`; None without one (no config.json, or not written by
    export.py). Invalid JSON is a DataError."""
    config = Path(directory) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{config} is not valid JSON ({err})") from None
    record = data.get("promptemb") if isinstance(data, dict) else None
    return record if isinstance(record, dict) else None


def source_kind(name_or_path: str) -> str:
    """`checkpoint`, `run`, `export` or `pretrained` (a plain Hugging Face model, loaded by `Encoder`)."""
    path = Path(name_or_path)
    if path.is_file():
        return "checkpoint"
    if path.is_dir() and ((path / CHECKPOINT_DIR).is_dir() or (path / RUN_STATUS).is_file()):
        return "run"  # a run that saved no checkpoint is still a run folder: one line, not a tokenizer traceback
    if path.is_dir() and export_block(path) is not None:
        return "export"
    return "pretrained"
