"""PromptBERT: unsupervised (two templates as two views) and supervised (NLI triplets) contrastive training."""

from __future__ import annotations

from collections.abc import Mapping

from promptemb.lightning_modules.base import PromptContrastiveModule
from promptemb.lightning_modules.heads import MLMTransformHead, MLPHead
from promptemb.poolers import build_pooler
from promptemb.poolers.base import Pooler
from promptemb.poolers.mask import MaskPooler

BERT_TEMPLATES = ('This sentence of "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] .')


class PromptBERTUnsup(PromptContrastiveModule):
    """Two templates give two views of each sentence; both are template-denoised (training only), passed through an
    MLP (dense + tanh, training only) and contrasted with InfoNCE (τ = 0.05). Evaluation: one template, [MASK]
    pooling without denoising, no MLP (PromptBERT §5, unsupervised recipe)."""

    template_views = 2

    def __init__(self, model_name_or_path: str, templates: list[str] = BERT_TEMPLATES, **kwargs):
        super().__init__(model_name_or_path, list(templates), **kwargs)
        self.mlp = MLPHead(self.transformer.config.hidden_size)
        self.train_pooler = MaskPooler("mask", denoise=self.hparams.denoise)

    def contrastive_views(self, batch: list[str]):
        first, second = (self.mlp(view) for view in self.pooled_views(batch, self.builders, self.train_pooler))
        return first, second, None

    def eval_poolers(self) -> list[Pooler]:
        return [MaskPooler("mask"), build_pooler("avg")]


class PromptBERTSup(PromptContrastiveModule):
    """NLI triplets (sentence, entailment, contradiction), one template for all three; representation =
    g(h_[MASK]) − g(bias) with g the MLM head's transform (dense + GELU + LayerNorm) initialised from the checkpoint's
    MLM head when it has one; denoised in training AND evaluation; contradictions are extra InfoNCE columns."""

    def __init__(self, model_name_or_path: str, templates: list[str] = BERT_TEMPLATES[1:], **kwargs):
        kwargs.setdefault("load_mlm_head", True)
        super().__init__(model_name_or_path, list(templates), **kwargs)
        config = self.transformer.config
        self.head = MLMTransformHead(config.hidden_size, getattr(config, "hidden_act", "gelu"),
                                     getattr(config, "layer_norm_eps", 1e-12))
        self.head_initialised_from_checkpoint = self._init_head_from_checkpoint()
        self.pooler = MaskPooler("mask", denoise=True, head=self.head)

    def _init_head_from_checkpoint(self) -> bool:
        if self.mlm_transform_state is None:
            return False
        self.head.load_state_dict(self.mlm_transform_state)
        self.mlm_transform_state = None  # used once; not part of the module's state
        return True

    def contrastive_views(self, batch):
        """`batch`: triplets of strings, or pre-tokenized {"ids": [B, 3, L], "lengths": [B, 3]}; rows are encoded
        in the order (triplet, member) either way."""
        if isinstance(batch, Mapping):
            sentences = {"ids": batch["ids"].flatten(0, 1), "lengths": batch["lengths"].flatten()}
        else:
            sentences = [s for triplet in batch for s in triplet]
        pooled = self.pooled(sentences, self.builders[0], self.pooler)
        pooled = pooled.view(pooled.shape[0] // 3, 3, -1)
        return pooled[:, 0], pooled[:, 1], pooled[:, 2]

    def eval_poolers(self) -> list[Pooler]:
        return [self.pooler, build_pooler("avg")]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["head_initialised_from_checkpoint"] = self.head_initialised_from_checkpoint
