"""What a user may point evaluate.py (or the Python API) at, resolved to the encoder, poolers and input form it must
be scored with.

* a train.py checkpoint (`.ckpt`): the module is rebuilt and scored exactly as the training callback scores it (its
  evaluation encoder, its own poolers, its evaluation template and sentence rule);
* a train.py run folder (`RUN/checkpoints/…`): its best checkpoint, as recorded by the run's checkpoint callback;
* an export folder (config.json with a `promptemb` block): the recorded template, sentence rule, token limit, pooler,
  denoising, head and OptiPrompt soft template;
* anything else (a Hugging Face model folder or hub name, `package:MODULE`): None; the caller loads it as a plain
  encoder with the template it was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from promptemb.common.errors import ConfigError
from promptemb.common.registry import qualified_name
from promptemb.encoder.loading import resolve_device
from promptemb.encoder.model import BATCH_SIZE, Encoder
from promptemb.encoder.sources import CHECKPOINT_DIR, source_kind
from promptemb.encoder.template import Template
from promptemb.inference.prompt_encoder import PromptEncoder
from promptemb.lightning_modules.checkpoint import load_module_checkpoint, read_checkpoint
from promptemb.poolers.base import Pooler

LAST_CHECKPOINT = "last.ckpt"


@dataclass
class TrainedModel:
    """A trained model ready to score: `poolers` are its own (what training scored it with, by the same names)."""

    encoder: Encoder
    poolers: list[Pooler]
    template: Template | None  # None: its poolers bring their own input form (LLM2Vec)
    sentence_rule: str
    max_sentence_tokens: int | None
    source: dict = field(default_factory=dict)  # provenance: kind, path, checkpoint sha256 and step / export record


def best_checkpoint(run_dir: Path) -> Path:
    """The best checkpoint of a train.py run folder: the one its checkpoint callback recorded in `last.ckpt` (paths
    stored relative to the checkpoint folder), else the folder's only non-last checkpoint."""
    folder = run_dir / CHECKPOINT_DIR
    last = folder / LAST_CHECKPOINT
    if last.is_file():
        for state in (read_checkpoint(last).get("callbacks") or {}).values():
            recorded = state.get("best_model_path") if isinstance(state, dict) else None
            if recorded:
                best = Path(recorded) if Path(recorded).is_absolute() else folder / recorded
                if best.is_file():
                    return best
    candidates = sorted(p for p in folder.glob("*.ckpt") if p.name != LAST_CHECKPOINT)
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ConfigError(f"run folder {run_dir} has no scored checkpoint in {folder}; train for at least "
                          "eval_every_n_steps steps, or pass a .ckpt file")
    raise ConfigError(f"run folder {run_dir}: cannot tell which of {len(candidates)} checkpoints is the best (no "
                      f"{LAST_CHECKPOINT} recording it); pass the .ckpt file")


def switch_to_eager_attention(transformer: torch.nn.Module) -> None:
    """Attention probabilities (ditto) need eager attention; the loaded copy is ours to switch."""
    if getattr(transformer.config, "_attn_implementation", None) != "eager":
        transformer.set_attn_implementation("eager")


def from_checkpoint(path: Path, *, device, batch_size: int, attentions: bool, source: dict) -> TrainedModel:
    loaded = load_module_checkpoint(path)
    module = loaded.module.to(resolve_device(device))
    if attentions:
        switch_to_eager_attention(module.transformer)
    source = {**source, "checkpoint": str(path.resolve()), "checkpoint_sha256": loaded.sha256,
              "global_step": loaded.global_step, "recipe": loaded.recipe, "module": qualified_name(type(module))}
    return TrainedModel(module.evaluation_encoder(batch_size), module.eval_poolers(), module.eval_template,
                        module.hparams.sentence_rule, None, source)


def from_export(directory: Path, *, device, batch_size: int, attentions: bool,
                verify_weights: bool = True) -> TrainedModel:
    exported = PromptEncoder.from_export(directory, batch_size=batch_size, device=str(resolve_device(device)),
                                         verify_weights=verify_weights)
    encoder = exported.encoder
    if attentions:
        switch_to_eager_attention(exported.transformer)
        encoder = Encoder.from_model(exported.transformer, exported.tokenizer, name=encoder.name_or_path,
                                     batch_size=batch_size, max_length=encoder.max_length,
                                     input_embedder=exported.soft_template)
    verification = {key: value for key, value in exported.source.items() if key.startswith("weights_")}
    source = {"kind": "export", "path": str(directory.resolve()), **verification, "record": exported.record()}
    return TrainedModel(encoder, [exported.pooler], exported.template, exported.sentence_rule,
                        exported.max_sentence_tokens, source)


def open_trained_model(name_or_path: str, *, device=None, batch_size: int = BATCH_SIZE, attentions: bool = False,
                       verify_weights: bool = True) -> TrainedModel | None:
    """The trained model at `name_or_path` (checkpoint, run folder or export), or None for a plain pretrained model.
    `attentions`: load with eager attention (some extra pooler reads attention probabilities); `verify_weights`
    False: an export whose weight files differ from their recorded sha256 is loaded, recorded as unverified."""
    kind = source_kind(name_or_path)
    path = Path(name_or_path)
    if kind == "checkpoint":
        return from_checkpoint(path, device=device, batch_size=batch_size, attentions=attentions,
                               source={"kind": "checkpoint"})
    if kind == "run":
        best = best_checkpoint(path)
        return from_checkpoint(best, device=device, batch_size=batch_size, attentions=attentions,
                               source={"kind": "run", "run_dir": str(path.resolve())})
    if kind == "export":
        return from_export(path, device=device, batch_size=batch_size, attentions=attentions,
                           verify_weights=verify_weights)
    return None


def check_input_form(model: TrainedModel, template: str | None, sentence_rule: str,
                     max_sentence_tokens: int | None) -> None:
    """A trained model is scored with the input form it was trained / exported with: an explicitly different
    template, sentence rule or token limit is refused rather than silently replaced."""
    what = model.source.get("kind", "model")
    if template and model.template is None:
        raise ConfigError(f"this {what} reads the plain sentence (LLM2Vec's input format, no template); drop the "
                          "template= / template.text= override to use it, or score the base model instead")
    if template and Template(template).text != model.template.text:
        raise ConfigError(f"this {what} was trained with template {model.template.text!r}; drop the template= / "
                          "template.text= override to use it, or score the base model instead")
    if sentence_rule not in ("none", model.sentence_rule):
        raise ConfigError(f"this {what} records sentence_rule={model.sentence_rule}; drop template.sentence_rule=")
    if max_sentence_tokens is not None and max_sentence_tokens != model.max_sentence_tokens:
        raise ConfigError(f"this {what} records max_sentence_tokens={model.max_sentence_tokens}; drop "
                          "max_sentence_tokens=")


def merge_poolers(own: list[Pooler], extra: list[Pooler], pooler_args: dict | None = None,
                  key: str = "pooler_args") -> list[Pooler]:
    """The model's own poolers, then each extra one whose name they do not already use (as the training callback).
    Arguments for a name the model's own pooler takes would be ignored: refused in one line (`key` names them)."""
    names = {pooler.name for pooler in own}
    if configured := sorted(names & set(pooler_args or {})):
        raise ConfigError(f"{key}.{configured[0]} would be ignored: {configured[0]} is the model's own pooler, scored "
                          "as the model was trained; drop the arguments")
    return own + [pooler for pooler in extra if pooler.name not in names]

