"""Prompt ensembles: one embedding from the embeddings of several poolers of the same run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler
from promptemb.poolers.fitted import CorpusFittedPooler


class EnsemblePooler(Pooler):
    """e = Σ_i w_i·ẽ_i / Σ_i w_i over the member poolers' embeddings e_i, with ẽ_i = e_i / ‖e_i‖ when `normalize`,
    else e_i; equal weights by default (the plain mean). Each member runs on its own input form, in the same forward
    as every other pooler of that form (a listed pooler or another ensemble's member): an ensemble adds no forward
    pass of its own. Written `pcot+ke` (members joined by `+`, each with the run's pooler_args for its name) or
    `ensemble` with `members`, `weights`, `normalize` and an optional shared `layer` in its pooler_args.

    `ck` is Cheng et al. 2025's "CK" (zifengcheng/CP evaluate_intervention.py, `--prompt_method ck`): the plain mean
    of the Knowledge Enhancement and Pretended CoT prompts' last-token states at one shared output layer (the
    script's `--output_layer`, default -1), not at the -2 the two methods use alone. `layer` records that shared
    layer (the registry builds every member at it); None keeps each member's own.
    """

    def __init__(self, name: str = "ensemble", members: Sequence[Pooler] = (), weights: Sequence[float] | None = None,
                 normalize: bool = False, layer: int | None = None, paper: str | None = None):
        super().__init__(name)
        self._members = list(members)
        self._labels = [member.name for member in self._members]
        if len(self._members) < 2:
            raise ConfigError(f"pooler {name!r} needs at least two member poolers, got {self._labels}; e.g. pcot+ke")
        for member in self._members:
            if isinstance(member, CorpusFittedPooler):
                raise ConfigError(f"pooler {name!r}: member {member.name!r} is fitted on a corpus (per task for T); "
                                  "an ensemble takes poolers without a fit step")
        if not isinstance(normalize, bool):
            raise ConfigError(f"pooler {name!r}: normalize must be true or false, got {normalize!r}")
        self.normalize = normalize
        self.weights = self._check_weights(weights)
        self.layer = layer
        self.paper = paper

    def _check_weights(self, weights: Sequence[float] | None) -> list[float]:
        if weights is None:
            return [1.0] * len(self._members)
        values = list(weights) if isinstance(weights, Sequence) and not isinstance(weights, str) else None
        if (values is None or len(values) != len(self._members)
                or not all(isinstance(w, int | float) and not isinstance(w, bool) for w in values)):
            raise ConfigError(f"pooler {self.name!r}: weights must be {len(self._members)} numbers, one per member "
                              f"({', '.join(self._labels)}), got {weights!r}")
        if not all(math.isfinite(w) and w >= 0 for w in values) or sum(values) <= 0:
            raise ConfigError(f"pooler {self.name!r}: weights must be finite, >= 0 and not all 0, got {values}")
        return [float(w) for w in values]

    @property
    def members(self) -> list[Pooler]:
        return list(self._members)

    @property
    def needs(self) -> Needs:
        needs = [member.needs for member in self._members]
        starts = [n.layers_from for n in needs if n.layers_from is not None]
        return Needs(layers=tuple(sorted({layer for n in needs for layer in n.layers})),
                     layers_from=min(starts) if starts else None,
                     **{flag: any(getattr(n, flag) for n in needs)
                        for flag in ("templated", "mask_token", "attentions", "word_embeddings", "mlm_head",
                                     "template_bias", "decoder")})

    def parts(self) -> list[Pooler]:
        # named after this pooler's current name (as MetaEOL's prompts), so two ensembles sharing a member, or a
        # member also listed alone, keep separate keys; a member with parts (metaeol) contributes its parts
        leaves = []
        for label, member in zip(self._labels, self._members, strict=True):
            member.name = f"{self.name}#{label}"
            leaves += member.parts() or [member]
        return leaves

    def combine(self, embeddings: Mapping[str, np.ndarray]) -> np.ndarray:
        self.parts()
        total = None
        for weight, member in zip(self.weights, self._members, strict=True):
            values = (member.combine(embeddings) if member.parts() else embeddings[member.name]).astype(np.float64)
            if self.normalize:
                values = values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)
            if total is not None and values.shape != total.shape:
                raise ConfigError(f"pooler {self.name!r}: member {member.name!r} gives {values.shape[1]}-dimensional "
                                  f"embeddings, the first member {total.shape[1]}; average members of one size")
            total = weight * values if total is None else total + weight * values
        return (total / sum(self.weights)).astype(np.float32)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        raise TypeError(f"pooler {self.name!r} averages {len(self._members)} poolers' embeddings; embed it through "
                        "Encoder.embed, which runs each member on its input form")

    def arguments(self) -> dict:
        equal = len(set(self.weights)) == 1
        return {"members": {label: member.describe()
                            for label, member in zip(self._labels, self._members, strict=True)},
                "weights": self.weights, "normalize": self.normalize,
                "combine": ("mean" if equal else "weighted mean") + (" of unit vectors" if self.normalize else ""),
                "shared_layer": self.layer, "paper": self.paper}
