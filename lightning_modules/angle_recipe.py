"""AnglE (Li & Li, ACL 2024, "AoE: Angle-optimized Embeddings for Semantic Textual Similarity"; official code
SeanLee97/AnglE, angle-emb 0.6.1) on the framework's prompt representation.

Each sentence fills one template and is represented by its [MASK] state (`model.denoise=true` subtracts the
template bias as PromptBERT does; off by default, the official code has no template). The batch is either

* pairs with gold scores (`data=stsb_pairs`, `data=sickr_pairs`; the official "format A"): cosine (CoSENT),
  in-batch negative and angle terms on the pairs (`angle_objective.AnglEObjective.pairs`), or
* triplets (`data=sick_triplets`, `data=nli`; the official "format C"): InfoNCE without and with the hard negatives,
  and the angle and cosine terms on (query, positive) pairs scored 1 and (query, negative) pairs scored 0
  (`AnglEObjective.triplets`),

with angle-emb 0.6.1's weights and scales unless the config sets its own. Under DDP the embeddings (and scores) of
every rank are gathered first, so the loss is that of one process on the global batch (the official trainer computes
each rank's loss on its own batch). Evaluation: the [MASK] state of the same template, and avg over the templated
input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

from promptemb.common.bounds import NonNegative, Positive
from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.angle import AnglePooling
from promptemb.lightning_modules.angle_objective import ANGLE_EMB_DEFAULTS, AnglEObjective
from promptemb.lightning_modules.base import PromptContrastiveModule
from promptemb.lightning_modules.in_batch import InBatchTargets
from promptemb.lightning_modules.losses import gather_with_grad
from promptemb.lightning_modules.matryoshka import configured_width
from promptemb.lightning_modules.promptbert import BERT_TEMPLATES
from promptemb.lightning_modules.recipe import register_recipe
from promptemb.poolers import build_pooler
from promptemb.poolers.base import Pooler
from promptemb.poolers.mask import MaskPooler

#: `data.format` values -> what a batch holds
PAIR_FORMATS = ("stsb", "sick_relatedness")
TRIPLET_FORMATS = ("nli_csv", "sick")
DataFormat = Literal["stsb", "sick_relatedness", "nli_csv", "sick"]
PAIR_DATA = "data=stsb_pairs or data=sickr_pairs"
TRIPLET_DATA = "data=sick_triplets or data=nli"


def global_objective(objective: AnglEObjective, views: list[torch.Tensor], scores: torch.Tensor | None) -> torch.Tensor:
    """The objective of the global batch: each member's rows ([B, D] per view: pair members, or query, positive,
    negative) and the scores gathered from every rank, this rank's slice differentiable (`losses.gather_with_grad`);
    `scores` None: triplets. The caller scales what it back-propagates by the world size, as for InfoNCE."""
    gathered = [gather_with_grad(view) for view in views]
    if scores is None:
        return objective.triplets(*gathered)
    return objective.pairs(gathered[0], gathered[1], gather_with_grad(scores.float()))


@register_recipe("angle")
class AnglE(PromptContrastiveModule):
    """AnglE on the [MASK] state of one template (see the module docstring). `data_format` is the training data's
    `data.format` (the recipe config reads it), so what the loss needs from the data is checked before anything
    loads. `cln_w`: null = angle-emb's 1.0 on triplets; the hard-negative term does not exist for scored pairs."""

    template_views = 1

    @classmethod
    def check_config(cls, settings: dict) -> None:
        """The base checks, then what AnglE cannot train with, each one line before any weights load."""
        super().check_config(settings)
        for key, why in (("grad_cache_chunk_size", "gradient caching"), ("matryoshka_dims", "Matryoshka widths"),
                         ("adaptive_layers", "adaptive layers")):
            if settings.get(key):
                raise ConfigError(f"model.{key}={settings[key]}: AnglE does not train with {why}; drop "
                                  f"model.{key}")
        if settings.get("temperature") is not None:
            raise ConfigError("model.temperature is InfoNCE's; AnglE scales each term by its own tau "
                              "(model.cosine_tau, model.ibn_tau, model.angle_tau): drop model.temperature")
        if "data_format" not in settings:  # the base constructor's partial check
            return
        data_format = settings["data_format"]
        weights = {key: settings.get(key, ANGLE_EMB_DEFAULTS.get(key)) for key in ("cosine_w", "ibn_w", "angle_w")}
        if data_format in PAIR_FORMATS:
            if settings.get("cln_w"):
                raise ConfigError(f"model.cln_w={settings['cln_w']} weighs AnglE's hard-negative term, which needs "
                                  f"triplets; data.format={data_format} gives scored pairs: drop model.cln_w (or "
                                  f"train on {TRIPLET_DATA})")
        elif data_format in TRIPLET_FORMATS:
            if settings.get("ibn_targets", "angle_emb") != "angle_emb":
                raise ConfigError(f"model.ibn_targets={settings['ibn_targets']} chooses the in-batch targets of "
                                  f"scored pairs; data.format={data_format} gives triplets (each query's positive is "
                                  "its target): drop model.ibn_targets")
            cln = settings.get("cln_w")
            weights["cln_w"] = ANGLE_EMB_DEFAULTS["cln_w"] if cln is None else cln
        else:
            got = "single sentences" if data_format is None else f"data.format={data_format}"
            raise ConfigError(f"AnglE trains on pairs with similarity scores ({PAIR_DATA}) or on triplets "
                              f"({TRIPLET_DATA}); the data config gives {got}")
        if not any(weight and weight > 0 for weight in weights.values()):
            raise ConfigError(f"every AnglE loss weight is 0 ({', '.join(f'model.{k}={v}' for k, v in weights.items())}"
                              "): give at least one term a weight > 0")
        width = configured_width(settings.get("model_name_or_path"))
        if weights["angle_w"] and width is not None and width % 2:
            raise ConfigError(f"model.angle_w={weights['angle_w']}: the angle term splits each embedding into real "
                              f"and imaginary halves, and {settings['model_name_or_path']} is {width} wide (odd): "
                              "set model.angle_w=0")

    def __init__(
        self,
        model_name_or_path: str,
        templates: list[str] = BERT_TEMPLATES[1:],
        data_format: DataFormat | None = None,
        cosine_w: NonNegative = ANGLE_EMB_DEFAULTS["cosine_w"],
        ibn_w: NonNegative = ANGLE_EMB_DEFAULTS["ibn_w"],
        cln_w: NonNegative | None = None,
        angle_w: NonNegative = ANGLE_EMB_DEFAULTS["angle_w"],
        cosine_tau: Positive = ANGLE_EMB_DEFAULTS["cosine_tau"],
        ibn_tau: Positive = ANGLE_EMB_DEFAULTS["ibn_tau"],
        angle_tau: Positive = ANGLE_EMB_DEFAULTS["angle_tau"],
        angle_pooling: AnglePooling = "sum",
        ibn_targets: InBatchTargets = "angle_emb",
        ibn_min_score: float = 1.0,
        denoise: bool = False,
        **kwargs,
    ):
        settings = {key: value for key, value in locals().items() if key not in ("self", "kwargs", "__class__")}
        type(self).check_config({**kwargs, **settings})
        super().__init__(model_name_or_path, list(templates), denoise=denoise, **kwargs)
        self.hparams.pop("temperature", None)  # InfoNCE's (the base's), unused here: not recorded with the weights
        triplets = data_format in TRIPLET_FORMATS
        self.objective = AnglEObjective(
            cosine_w=cosine_w, ibn_w=ibn_w, angle_w=angle_w, cosine_tau=cosine_tau, ibn_tau=ibn_tau,
            angle_tau=angle_tau, angle_pooling=angle_pooling, ibn_targets=ibn_targets, ibn_min_score=ibn_min_score,
            cln_w=(ANGLE_EMB_DEFAULTS["cln_w"] if cln_w is None else cln_w) if triplets else 0.0)
        self.pairs = not triplets
        width = self.transformer.config.hidden_size
        if angle_w and width % 2:
            raise ConfigError(f"model.angle_w={angle_w}: the angle term needs an even width; {model_name_or_path} "
                              f"is {width} wide: set model.angle_w=0")
        self.pooler = MaskPooler("mask", denoise=denoise)

    def batch_sentences(self, batch) -> tuple[object, int, torch.Tensor | None]:
        """(the sentences of every example in (example, member) order, members per example, the gold scores or
        None): a batch of scored pairs ({"ids", "lengths", "scores"} or {"pairs", "scores"}) or of triplets
        ({"ids", "lengths"} [B, 3, ...] or a list of string triplets)."""
        scores = batch.get("scores") if isinstance(batch, Mapping) else None
        if (scores is not None) != self.pairs:
            expected = "pairs with scores" if self.pairs else "triplets"
            raise ConfigError(f"AnglE was configured for {expected} (model.data_format="
                              f"{self.hparams.data_format}) but the batch holds "
                              f"{'pairs with scores' if scores is not None else 'examples without scores'}")
        if isinstance(batch, Mapping) and "ids" in batch:
            members = batch["ids"].shape[1]
            sentences = {key: batch[key].flatten(end_dim=1 if key == "ids" else -1)
                         for key in ("ids", "lengths", "host_lengths") if key in batch}
        else:
            examples = batch["pairs"] if isinstance(batch, Mapping) else batch
            members = len(examples[0])
            sentences = [sentence for example in examples for sentence in example]
        return sentences, members, scores

    def contrastive_loss(self, batch):
        """(the AnglE loss of the global batch, this rank's examples, identity): every sentence in one forward."""
        sentences, members, scores = self.batch_sentences(batch)
        pooled = self.pooled(sentences, self.builders[0], self.pooler)
        pooled = pooled.view(pooled.shape[0] // members, members, -1)
        loss = global_objective(self.objective, list(pooled.unbind(1)), scores if self.pairs else None)
        return loss, pooled.shape[0], lambda value: value

    def eval_poolers(self) -> list[Pooler]:
        return [self.pooler, build_pooler("avg")]
