"""A `PromptEncoder` behind MTEB's encoder protocol (mteb >= 2: `encode(DataLoader[BatchedInput], *, task_metadata,
hf_split, hf_subset, prompt_type, **kwargs)`; mteb 1.x: `encode(list[str], **kwargs)`), so

    mteb.evaluate(MTEBEncoder(load_encoder(DIR)), tasks=mteb.get_tasks(["STSBenchmark"]))

scores exactly the embeddings the framework scored. The template already is the prompt: MTEB's query/passage
prompt types and task instructions are ignored (both sides of every task get the same template).
Note: MTEB's SICK-R uses all 9927 pairs, not the 4927-pair test split the framework's SICK-R number uses.
"""

from __future__ import annotations

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


class MTEBEncoder:
    """MTEB encoder protocol around a `PromptEncoder` (cosine similarity, like the framework's STS scorer)."""

    def __init__(self, encoder: PromptEncoder, name: str | None = None, revision: str | None = None,
                 batch_size: int = 64):
        self.encoder = encoder
        self.batch_size = batch_size
        base = str(encoder.source.get("base_model", "model")).replace("package:", "").rstrip("/")
        self.name = name or f"promptemb/{Path(base).name}"
        self.revision = revision or (encoder.source.get("checkpoint_sha256") or "local")[:12]
        self._meta = None

    @property
    def mteb_model_meta(self):
        if self._meta is None:
            from mteb.models.model_meta import ModelMeta

            self._meta = ModelMeta.create_empty(overwrites={
                "name": self.name, "revision": self.revision, "embed_dim": self.encoder.encoder.hidden_size,
                "max_tokens": self.encoder.encoder.max_length, "similarity_fn_name": "cosine",
                "framework": ["PyTorch"], "modalities": ["text"],
            })
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
