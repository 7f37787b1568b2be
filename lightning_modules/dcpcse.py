"""DCPCSE (Jiang et al. 2022, "Improved Universal Sentence Embeddings with Prompt-based Contrastive Learning and
Energy-based Learning"; official code YJiangcm/DCPCSE, promcse/models.py at 4b319380fa13d018811dd0631bcbeee838c3218e):
deep continuous prompts on a frozen BERT / RoBERTa, trained contrastively.

The deep sibling of OptiPrompt (lightning_modules/optiprompt.py): instead of soft vectors in the input, P-tuning v2
prefixes (lightning_modules/deep_prompt.py) give every layer's self-attention P trainable keys and values. The
sentence is the plain input `[CLS] sentence [SEP]`; its representation is the last layer's [CLS] state through the
official `MLPLayer` (tanh(W h + b), initialised as the official `init_weights`: normal(0, initializer_range), b = 0).
What trains is what the official model trains: the prefixes and that MLP (created after the encoder is frozen, it keeps
requires_grad); the encoder is frozen.

* unsupervised (a batch of sentences): two dropout views of each sentence, InfoNCE (SimCSE) with temperature 0.05;
  the MLP in training only (`mlp_only_train`, the official unsupervised recipe), [CLS] alone in evaluation;
* supervised (a batch of (anchor, entailment, contradiction) triplets): InfoNCE with the contradictions as extra
  columns, plus the energy-based hinge loss (`eh_loss_weight` · mean(max(0, margin − cos(a_i, p_i) +
  max_{j≠i, k} {cos(a_i, p_j), cos(a_i, n_k)}))) of the official `--do_eh_loss`; the MLP in training and evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from promptemb.common.bounds import AtLeastOne, NonNegative
from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.base import PromptContrastiveModule
from promptemb.lightning_modules.deep_prompt import (
    DeepPrompt,
    DeepPromptConfig,
    check_deep_prompt_model,
    local_model_config,
)
from promptemb.lightning_modules.heads import MLPHead
from promptemb.lightning_modules.losses import gather_with_grad, info_nce
from promptemb.lightning_modules.recipe import EncodingSpec, register_recipe
from promptemb.poolers import build_pooler
from promptemb.poolers.base import Pooler
from promptemb.poolers.cls import CLSPooler

#: The plain input: DCPCSE prompts through the prefixes, not through template words.
PLAIN_TEMPLATE = "[X]"

#: Training options the prefixes are not built for, refused before anything loads: the prefixes are drawn once per
#: transformer call and read by each layer's hook, which a recomputation in backward (activation checkpointing) or a
#: chunked re-forward (gradient caching) would not replay; Matryoshka widths and adaptive layers were never part of
#: the method.
UNSUPPORTED = {"grad_cache_chunk_size": "gradient caching", "gradient_checkpointing": "activation checkpointing",
               "matryoshka_dims": "Matryoshka widths", "adaptive_layers": "adaptive layers",
               "denoise": "template denoising (there is no template)",
               "freeze_bias": "frozen template biases (there is no template)"}


def energy_hinge(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor,
                 margin: float) -> torch.Tensor:
    """mean_i max(0, margin - cos(a_i, p_i) + max(max_{j≠i} cos(a_i, p_j), max_k cos(a_i, n_k))): the official
    `MarginRankingLoss(margin)(anchor_pos·temp, max_s3_sn·temp, 1)`, whose operands are the cosines (the official
    code divides by the temperature and multiplies back; the diagonal is excluded by setting it to -1e9)."""
    a = torch.nn.functional.normalize(anchors.float(), dim=-1)
    to_positives = a @ torch.nn.functional.normalize(positives.float(), dim=-1).T
    to_negatives = a @ torch.nn.functional.normalize(negatives.float(), dim=-1).T
    diagonal = torch.eye(to_positives.shape[0], dtype=torch.bool, device=a.device)
    hardest = torch.cat([to_positives.masked_fill(diagonal, -1e9), to_negatives], dim=1).max(dim=1).values
    return torch.clamp(margin - to_positives.diagonal() + hardest, min=0).mean()


def dcpcse_objective(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None,
                     temperature: float, eh_loss_weight: float, eh_loss_margin: float) -> torch.Tensor:
    """InfoNCE, plus `eh_loss_weight` × the energy-based hinge loss when there are hard negatives, both on the global
    batch (every rank's rows gathered, this rank's slice differentiable), as the official cl_forward gathers z1, z2,
    z3 before both. The caller scales what it back-propagates by the world size, as for InfoNCE."""
    loss = info_nce(anchors, positives, temperature, negatives)
    if negatives is not None and eh_loss_weight > 0:
        hinge = energy_hinge(gather_with_grad(anchors), gather_with_grad(positives), gather_with_grad(negatives),
                             eh_loss_margin)
        loss = loss + eh_loss_weight * hinge
    return loss


@register_recipe("dcpcse")
class DCPCSE(PromptContrastiveModule):
    """Frozen encoder with deep prompts (`pre_seq_len` prefix positions at every layer; `prefix_projection`: the
    official MLP reparameterisation with `prefix_hidden_size` hidden units), trained with InfoNCE on two dropout
    views (sentences) or on triplets with hard negatives, plus the energy-based hinge loss when `eh_loss_weight` > 0
    (triplets only, as the official code). See the module docstring."""

    requires_mask = False
    template_views = 0  # the plain sentence: the template config gives none (template=none)

    @classmethod
    def check_config(cls, settings: dict) -> None:
        for key, what in UNSUPPORTED.items():
            if settings.get(key):
                raise ConfigError(f"model.{key}={settings[key]}: DCPCSE does not train with {what}; drop model.{key}")
        super().check_config(settings)
        if (config := local_model_config(settings.get("model_name_or_path"))) is not None:
            check_deep_prompt_model(config)  # a local model's family, read before its weights load

    @classmethod
    def check_compile(cls, settings: dict) -> None:
        raise ConfigError("trainer.compile=true compiles the training forward; DCPCSE's prefixes enter through hooks "
                          "on every layer, which the compiled graph is not tested with: drop trainer.compile")

    def compile_training_forward(self) -> None:
        type(self).check_compile({})

    def __init__(self, model_name_or_path: str, pre_seq_len: AtLeastOne = 16, prefix_projection: bool = False,
                 prefix_hidden_size: AtLeastOne = 512, mlp_only_train: bool = True,
                 eh_loss_weight: NonNegative = 0.0, eh_loss_margin: NonNegative = 0.2, **kwargs):
        type(self).check_config({**kwargs, "model_name_or_path": model_name_or_path})
        kwargs.setdefault("denoise", False)
        # a checkpoint's hyper_parameters record the base's template arguments: only the plain input is valid
        templates, eval_template = list(kwargs.pop("templates", [PLAIN_TEMPLATE])), kwargs.pop("eval_template", None)
        if templates != [PLAIN_TEMPLATE] or eval_template not in (None, PLAIN_TEMPLATE):
            raise ConfigError(f"DCPCSE prompts through its prefixes on the plain sentence ({PLAIN_TEMPLATE!r}), not "
                              f"through template words: got templates={templates!r}, eval_template={eval_template!r}")
        super().__init__(model_name_or_path, [PLAIN_TEMPLATE], **kwargs)
        config = self.transformer.config
        check_deep_prompt_model(config)
        self.transformer.requires_grad_(False)
        self.deep_prompt = DeepPrompt(DeepPromptConfig.for_model(config, pre_seq_len, prefix_projection,
                                                                 prefix_hidden_size))
        self.deep_prompt.attach(self.transformer)
        # The tokens' positions start after the prefix: the input must leave the prefix room in the position table.
        self.max_length -= pre_seq_len
        if self.max_length < 3:
            raise ConfigError(f"model.pre_seq_len={pre_seq_len} leaves no room for a sentence in "
                              f"{model_name_or_path}'s position table")
        self.builders = [self._builder(t, self.hparams.max_sentence_tokens) for t in self.templates]
        # the official MLPLayer, created after the freeze (it trains) and drawn as `init_weights` draws it
        self.mlp = MLPHead(config.hidden_size, init_std=float(getattr(config, "initializer_range", 0.02)))
        self.pooler = CLSPooler("cls")
        self.eval_pooler = CLSPooler("cls", head=None if mlp_only_train else self.mlp)

    def contrastive_views(self, batch):
        """Sentences (a list of strings, or pre-tokenized {"ids": [B, L], ...}): two dropout views of each, in one
        forward; triplets (a list of 3-sequences, or {"ids": [B, 3, L], ...}): anchor, positive, hard negative, each
        row encoded once. Every view goes through the MLP, as in the official cl_forward."""
        if isinstance(batch, Mapping):
            members = 1 if batch["ids"].dim() == 2 else batch["ids"].shape[1]
            sentences = batch if members == 1 else {key: batch[key].flatten(end_dim=1 if key == "ids" else -1)
                                                    for key in ("ids", "lengths", "host_lengths") if key in batch}
        elif batch and isinstance(batch[0], str):
            members, sentences = 1, list(batch)
        else:
            members = len(batch[0])
            sentences = [sentence for example in batch for sentence in example]
        if members == 1:
            first, second = self.pooled_views(sentences, [self.builders[0]] * 2, self.pooler)
            return self.mlp(first), self.mlp(second), None
        if members not in (2, 3):
            raise ConfigError(f"DCPCSE trains on sentences, pairs or triplets; the batch holds {members} per example")
        pooled = self.mlp(self.pooled(sentences, self.builders[0], self.pooler))
        pooled = pooled.view(pooled.shape[0] // members, members, -1)
        return pooled[:, 0], pooled[:, 1], pooled[:, 2] if members == 3 else None

    def contrastive_objective(self, anchors, positives, negatives):
        hparams = self.hparams
        return dcpcse_objective(anchors, positives, negatives, hparams.temperature, hparams.eh_loss_weight,
                                hparams.eh_loss_margin)

    def eval_poolers(self) -> list[Pooler]:
        return [self.eval_pooler, build_pooler("avg")]

    def encoding_spec(self, pooler: str | None = None, denoise: bool | None = None,
                      adapter: str | None = None) -> EncodingSpec:
        """Its [CLS] (through the MLP when it scores checkpoints so) or the plain mean, attending over its deep
        prompts."""
        if pooler not in (None, "cls", "avg"):
            raise ConfigError(f"a model with deep prompts (DCPCSE) exports pooler=cls or avg, not {pooler}")
        spec = super().encoding_spec(pooler, denoise, adapter)
        spec.deep_prompt = self.deep_prompt
        return spec
