"""A `PromptEncoder` behind MTEB's encoder protocol (mteb >= 2: `encode(DataLoader[BatchedInput], *, task_metadata,
hf_split, hf_subset, prompt_type, **kwargs)`; mteb 1.x: `encode(list[str], **kwargs)`), so

    mteb.evaluate(MTEBEncoder(load_encoder(DIR)), tasks=mteb.get_tasks(["STSBenchmark"]))

scores exactly the embeddings the framework scored. The template already is the prompt: MTEB's query/passage
prompt types and task instructions are ignored (both sides of every task get the same template). Decoders (the
template's last token) go through the same wrapper.

`mteb_model_meta` is filled from the model: parameter count, embedding size, token limit, cosine similarity, the
framework, the checkpoint's revision and date, and `training_datasets`: for a trained checkpoint (or its export) the
corpus files its lineage records, plus the MTEB task each of them belongs to (SICK-train triplets -> SICK-R, so
MTEB flags the overlap); None for a plain model (its pre-training data is not known here).
Note: MTEB's SICK-R uses all 9927 pairs, not the 4927-pair test split the framework's SICK-R number uses.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import numpy as np

from promptemb.inference.prompt_encoder import PromptEncoder


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


def parameter_count(encoder: PromptEncoder) -> int:
    """Every weight the embedding uses: the transformer (with a kept LoRA adapter), the head, the soft template, the
    deep prompts."""
    parts = [encoder.transformer, encoder.head, encoder.soft_template, encoder.deep_prompt]
    return sum(p.numel() for part in parts if part is not None for p in part.parameters())


def release_date(source: dict) -> str | None:
    """The day the checkpoint (or export) was written, from its file's modification time; None for a plain model."""
    for key in ("checkpoint", "export_dir"):
        path = Path(str(source.get(key) or ""))
        if source.get(key) and path.exists():
            stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)
            return stamp.date().isoformat()
    return None


class MTEBEncoder:
    """MTEB encoder protocol around a `PromptEncoder` (cosine similarity, like the framework's STS scorer)."""

    def __init__(self, encoder: PromptEncoder, name: str | None = None, revision: str | None = None,
                 batch_size: int = 64):
        self.encoder = encoder
        self.batch_size = batch_size
        base = str(encoder.source.get("base_model", "model")).replace("package:", "").replace("model:", "").rstrip("/")
        self.name = name or f"promptemb/{Path(base).name}"
        self.revision = revision or (encoder.source.get("checkpoint_sha256") or "local")[:12]
        self._meta = None

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
        }

    @property
    def mteb_model_meta(self):
        if self._meta is None:
            from mteb.models.model_meta import ModelMeta

            self._meta = ModelMeta.create_empty(overwrites=self.meta_fields())
        return self._meta

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
