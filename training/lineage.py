"""A run's lineage: what exact resume depends on, recorded in every checkpoint and compared before a resume.

Lightning restores weights, optimiser and loop counters from any checkpoint whose tensors fit, and the datamodule
restores a position counted in batches; neither knows whether the corpus, the batch size or the model behind them are
still the ones the checkpoint was trained with. So every checkpoint carries `promptemb_lineage` (`run_lineage`):

* the training data as read: the sha256 of each corpus file, in order, with the settings that select examples from
  them (format, `max_examples`, held-out tasks) — a shuffled corpus with the same line count is another corpus;
* the global batch size and the sampler settings (seed, length grouping, distinct batches): the data position is a
  count of global batches, so another batch size would skip the wrong examples (the world size may change);
* the backbone (name and the sha256 of its weight files), the tokenizer (sha256 of its files), the recipe class and
  the template(s) with the settings that turn sentences into inputs (sentence rule, sentence length).

A resume whose config differs in any of them is refused with one line naming each changed item (`check_lineage`).
Paths are recorded for the message only: a corpus or a model that moved with the same content resumes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytorch_lightning as pl

from promptemb.common.errors import ConfigError
from promptemb.common.instantiate import build
from promptemb.data.checksums import sha256_file
from promptemb.data.mined_triplets import mined_provenance, mined_summary
from promptemb.encoder.loading import resolve_model_path
from promptemb.lightning_modules.checkpoint import LINEAGE_KEY
from promptemb.training.settings import TrainSettings

#: Files of a Hugging Face model directory that hold its weights, and those that define its tokenizer.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model")
#: Recipe settings (hyper-parameters of the module) that decide what the model is fed.
INPUT_SETTINGS = ("templates", "template", "eval_template", "sentence_rule", "max_sentence_tokens", "negative_template",
                  "train_sentence_rule")
#: Datamodule settings that decide which examples are read and in which order.
SELECTION_SETTINGS = ("format", "max_examples", "held_out_tasks")
SAMPLER_SETTINGS = ("seed", "group_by_length", "distinct_in_batch")


def files_sha256(paths: list[Path]) -> str | None:
    """One digest over the named files' digests (None when there are none)."""
    if not paths:
        return None
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        digest.update(f"{path.name}:{sha256_file(path, cached=False)}\n".encode())
    return digest.hexdigest()


def local_model_dir(name_or_path: str) -> Path | None:
    """The directory a backbone's files are read from: a local or packaged model, or a Hub model already in the
    local cache; None when only the Hub has it."""
    path = Path(resolve_model_path(name_or_path)).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name_or_path), local_files_only=True))
    except Exception:  # not cached (or not a Hub name): the name is all there is to compare
        return None


def backbone_lineage(name_or_path: str) -> dict:
    directory = local_model_dir(name_or_path)
    weights = [p for pattern in WEIGHT_PATTERNS for p in directory.glob(pattern)] if directory else []
    tokenizer = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()] if directory else []
    return {"backbone": str(name_or_path), "backbone_weights_sha256": files_sha256(weights),
            "tokenizer_sha256": files_sha256(tokenizer)}


def data_lineage(data: dict) -> dict:
    """The corpus files' content (in order) and the settings that pick and order examples from them."""
    datamodule = build(data)
    names = datamodule.corpus_names()
    paths = [datamodule.resolve(name) for name in names]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise ConfigError(f"corpus file {missing[0]} does not exist (relative paths are relative to the data root)")
    record = {"data.files": names, "data.files_sha256": [sha256_file(path, cached=False) for path in paths],
              "data.batch_size": datamodule.batch_size}
    if datamodule.corpus_format() == "nli_csv" and any(mined := [mined_summary(mined_provenance(p)) for p in paths]):
        record["data.mined"] = mined  # what mined each hard-negative file (checked against it)
    record.update({f"data.{key}": data.get(key) for key in (*SELECTION_SETTINGS, *SAMPLER_SETTINGS)})
    return record


def run_lineage(settings: TrainSettings) -> dict:
    """What exact resume depends on, from train.py's settings (reads the corpus files and the backbone's weight and
    tokenizer files to hash them)."""
    return {"recipe": settings.recipe, **backbone_lineage(settings.backbone_name), **input_lineage(settings.model),
            **data_lineage(settings.data)}


def input_lineage(settings: dict) -> dict:
    """The recipe settings that decide what the model is fed; OptiPrompt's one `template` is the `templates` of the
    other recipes."""
    record = {f"model.{key}": settings.get(key) for key in INPUT_SETTINGS if key in settings}
    if "model.template" in record:
        record["model.templates"] = [record.pop("model.template")]
    return record


def short(value) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]  # a sha256
    return str(value)


def lineage_changes(saved: dict, current: dict) -> list[str]:
    """One phrase per item that differs between a checkpoint's lineage and this run's, `item: saved -> now`. Items
    only one side records are not compared; a backbone or corpus compares by content, its name only when there is
    no content hash to compare."""
    changes = []
    for key, now in current.items():
        if key not in saved or key in ("data.files",) or saved[key] == now:
            continue
        before = saved[key]
        if key == "backbone" and saved.get("backbone_weights_sha256") and current.get("backbone_weights_sha256"):
            continue  # same weights under another name (a moved or re-downloaded model) is the same backbone
        if key == "data.files_sha256":
            names = current.get("data.files") or []
            if len(before) != len(now):
                changes.append(f"training data: {len(before)} corpus file(s) -> {len(now)}")
                continue
            changes += [f"training data {names[i] if i < len(names) else i}: content changed (sha256 "
                        f"{short(before[i])} -> {short(now[i])})" for i in range(len(now)) if before[i] != now[i]]
            continue
        label = {"backbone_weights_sha256": "backbone weights (sha256)", "tokenizer_sha256": "tokenizer (sha256)",
                 "recipe": "recipe (model._target_)", "backbone": "backbone"}.get(key, key)
        changes.append(f"{label} {short(before)} -> {short(now)}")
    return changes


def check_lineage(checkpoint_path: Path, checkpoint: dict, current: dict) -> None:
    """Refuse, in one line naming every changed item, a resume whose config does not match what the checkpoint was
    trained with."""
    saved = checkpoint.get(LINEAGE_KEY)
    if not isinstance(saved, dict):
        raise ConfigError(f"cannot resume from {checkpoint_path}: it records no lineage (corpus, settings, base "
                          "weights) to check the resume against; pass a checkpoint written by train.py")
    changes = lineage_changes(saved, current)
    if changes:
        raise ConfigError(f"cannot resume from {checkpoint_path}: it was trained with other settings: "
                          f"{'; '.join(changes)}; resume with the settings it was trained with, or start a fresh run "
                          "in a new output_dir")


class LineageCallback(pl.Callback):
    """Writes the run's lineage into every checkpoint it saves. Computed when training starts unless already known
    (a resume compares it first): by then a downloaded corpus is on disk, and a run refused earlier hashed nothing."""

    def __init__(self, compute: Callable[[], dict], known: dict | None = None):
        self.compute = compute
        self.lineage = dict(known) if known is not None else None

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.lineage is None:
            self.lineage = self.compute()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[LINEAGE_KEY] = self.lineage if self.lineage is not None else self.compute()
