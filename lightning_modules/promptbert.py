"""PromptBERT: unsupervised (two templates as two views) and supervised (NLI triplets) contrastive training."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Literal

import torch

from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.base import PromptContrastiveModule
from promptemb.lightning_modules.heads import MLMTransformHead, MLPHead
from promptemb.lightning_modules.recipe import register_recipe
from promptemb.poolers import build_pooler
from promptemb.poolers.base import Pooler
from promptemb.poolers.mask import MaskPooler

BERT_TEMPLATES = ('This sentence of "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] .')


@register_recipe("promptbert_unsup")
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
        first, second = (self._projected(view) for view in self.pooled_views(batch, self.builders, self.train_pooler))
        return first, second, None

    def _projected(self, view: torch.Tensor) -> torch.Tensor:
        """MLP(h); with Matryoshka widths, [MLP(h), h]: the MLP is dropped at evaluation and takes all D inputs,
        so a prefix of MLP(h) would not be a prefix of anything evaluated — the narrower terms truncate h itself
        (`contrastive_objective`)."""
        projected = self.mlp(view)
        return projected if self.matryoshka is None else torch.cat([projected, view], dim=-1)

    def layer_objective(self, anchors, positives, negatives, matryoshka):
        """InfoNCE of MLP(h); with Matryoshka widths Σ_k w_k · InfoNCE, the full-width term on MLP(h) (the plain
        loss) and each narrower term on the first d_k components of h, the representation evaluated."""
        if matryoshka is None:
            return super().layer_objective(anchors, positives, negatives, None)
        width = self.transformer.config.hidden_size

        def truncate(views: torch.Tensor, dim: int) -> torch.Tensor:
            return views[..., :width] if dim == width else views[..., width:width + dim]

        return matryoshka.loss(anchors, positives, negatives, self.hparams.temperature, truncate)

    def full_representation(self, views: torch.Tensor) -> torch.Tensor:
        """MLP(h), what the plain loss contrasts (with widths, the first half of [MLP(h), h])."""
        return views if self.matryoshka is None else views[..., :self.transformer.config.hidden_size]

    def eval_poolers(self) -> list[Pooler]:
        return [MaskPooler("mask"), build_pooler("avg")]


#: PromptBERTSup's heads: `mlm_transform` = the BERT recipe's g(h) − g(δ), g the MLM head's transform;
#: `tanh_mlp` = the reference's RoBERTa recipe, tanh(W(h − δ) + b) randomly initialised.
SupervisedHead = Literal["mlm_transform", "tanh_mlp"]
SUPERVISED_HEADS = typing.get_args(SupervisedHead)


@register_recipe("promptbert_sup")
class PromptBERTSup(PromptContrastiveModule):
    """NLI triplets (sentence, entailment, contradiction), one template for all three; denoised in training AND
    evaluation; contradictions are extra InfoNCE columns. Representation (`head_type`): `mlm_transform`, g(h_[MASK]) −
    g(bias) with g the MLM head's transform (dense + GELU + LayerNorm) initialised from the checkpoint's MLM head
    when it has one (kongds/Prompt-BERT's BERT recipe); `tanh_mlp`, tanh(W(h_[MASK] − bias) + b) with W, b
    initialised as the reference does (its supervised RoBERTa recipe, whose evaluation applies the trained head
    too)."""

    def __init__(self, model_name_or_path: str, templates: list[str] = BERT_TEMPLATES[1:],
                 head_type: SupervisedHead = "mlm_transform", denoise: Literal[True] = True, **kwargs):
        """`denoise` is always on: the recipe's pooler denoises in training and evaluation (the type refuses
        false)."""
        if head_type not in SUPERVISED_HEADS:
            raise ConfigError(f"unknown head_type {head_type!r}; valid: {', '.join(SUPERVISED_HEADS)}")
        if denoise is not True:
            raise ConfigError("PromptBERTSup always denoises its [MASK] representation; drop model.denoise=false")
        kwargs.setdefault("load_mlm_head", head_type == "mlm_transform")
        super().__init__(model_name_or_path, list(templates), denoise=True, **kwargs)
        config = self.transformer.config
        if head_type == "tanh_mlp":
            self.head = MLPHead(config.hidden_size, init_std=getattr(config, "initializer_range", 0.02))
            self.head_initialised_from_checkpoint = False
        else:
            self.head = MLMTransformHead(config.hidden_size, getattr(config, "hidden_act", "gelu"),
                                         getattr(config, "layer_norm_eps", 1e-12))
            self.head_initialised_from_checkpoint = self._init_head_from_checkpoint()
        self.pooler = MaskPooler("mask", denoise=True, head=self.head, head_after_denoise=head_type == "tanh_mlp")

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
            sentences = {key: batch[key].flatten(end_dim=1 if key == "ids" else -1)
                         for key in ("ids", "lengths", "host_lengths") if key in batch}
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
