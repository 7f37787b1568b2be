"""Matryoshka representation learning (Kusupati et al. 2022, "Matryoshka Representation Learning"): the contrastive
loss summed over truncated prefixes of the representation, so its first d components are an embedding of their own.

    L = Σ_k w_k · InfoNCE(a[:, :d_k], p[:, :d_k], n[:, :d_k])

with InfoNCE the recipe's (cosine / τ, normalisation after truncation): sentence-transformers' `MatryoshkaLoss`
around `MultipleNegativesRankingLoss(scale=1/τ)`, with its semantics — only the listed widths are trained (list the
full width to keep the plain loss), weights default to 1, terms summed from the widest down.

Adaptive layers (Li et al. 2024, "2D Matryoshka Sentence Embeddings"): the same objective also on the representation
of a model cut after an earlier layer, so the first layers are an encoder of their own; with widths, in both
dimensions. sentence-transformers' `AdaptiveLayerLoss` (`Matryoshka2dLoss` with widths), with its semantics:

    L = w_last · O(L) + Σ_{l ∈ S} [ w_prior · c(l) / |S| · O(l) + w_kl · T · KL(softmax(e_L / T) ‖ softmax(e_l / T)) ]

O(l) is the recipe's objective on its views pooled from layer l's states (the pooler re-run on them, the heads
applied, as for the last layer), with each width drawn for that layer; S the prior layers drawn for the step; e_l the
full-width views of all rows; the KL term's target is detached (the last layer teaches) and averaged over rows.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from promptemb.common.bounds import NonNegative, NonNegativeInt
from promptemb.common.errors import ConfigError, UserError
from promptemb.common.validation import check_value, not_a_key
from promptemb.encoder.loading import resolve_model_path
from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.lightning_modules.losses import gather_with_grad, info_nce

log = logging.getLogger(__name__)

#: `truncate(tensor, d)`: the first d components of a representation (a recipe may read them elsewhere)
Truncate = Callable[[torch.Tensor, int], torch.Tensor]


def check_matryoshka_settings(dims: Sequence[int] | None, weights: Sequence[float] | None,
                              key: str = "model.matryoshka_dims") -> None:
    """What is wrong with a (dims, weights) pair, without a model: weights without dims, lengths that differ, a
    width listed twice, a width below 1 or a weight <= 0 (the type hints refuse those first, where checked)."""
    weights_key = key.replace("matryoshka_dims", "matryoshka_weights")
    if dims is None:
        if weights is not None:
            raise ConfigError(f"{weights_key} is set but {key} is not: set {key} (the widths these weigh) or drop "
                              f"{weights_key}")
        return
    dims = list(dims)
    if not dims:
        raise ConfigError(f"{key}=[] trains no width; list widths such as [384,128,64], or set {key}=null")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(f"{key}={dims}: every width must be an integer >= 1")
    if len(set(dims)) != len(dims):
        raise ConfigError(f"{key}={dims} lists a width twice; list each once (weigh it with {weights_key})")
    if weights is not None:
        weights = list(weights)
        if len(weights) != len(dims):
            raise ConfigError(f"{weights_key} has {len(weights)} value(s) but {key} has {len(dims)}: give one "
                              "weight per width, in the same order")
        if any(isinstance(w, bool) or not isinstance(w, int | float) or not w > 0 for w in weights):
            raise ConfigError(f"{weights_key}={weights}: every weight must be a number > 0")


def _configured(name_or_path, keys: tuple[str, ...]) -> int | None:
    """The first of `keys` a local model (directory or `package:MODULE`) declares as an integer in its config.json,
    read without loading it; None for anything else (a Hub name: the recipe checks the loaded model instead)."""
    if not isinstance(name_or_path, str):
        return None
    try:
        directory = Path(resolve_model_path(name_or_path)).expanduser()
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (UserError, OSError, ValueError):
        return None
    value = next((config[key] for key in keys if key in config), None) if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def configured_width(name_or_path) -> int | None:
    """The hidden size a local model declares in its config.json (`_configured`)."""
    return _configured(name_or_path, ("hidden_size", "d_model"))


def configured_depth(name_or_path) -> int | None:
    """The number of transformer layers a local model declares in its config.json (`_configured`)."""
    return _configured(name_or_path, ("num_hidden_layers", "n_layer", "num_layers"))


@dataclass(frozen=True)
class Matryoshka:
    """The widths (widest first) and their weights; `check_width` against the representation they truncate."""

    dims: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def build(cls, dims: Sequence[int] | None, weights: Sequence[float] | None = None) -> Matryoshka | None:
        """None without dims; weights default to 1 each; sorted by width, widest first (as MatryoshkaLoss)."""
        check_matryoshka_settings(dims, weights)
        if dims is None:
            return None
        weights = [1.0] * len(dims) if weights is None else [float(w) for w in weights]
        pairs = sorted(zip((int(d) for d in dims), weights, strict=True), key=lambda pair: pair[0], reverse=True)
        return cls(tuple(d for d, _ in pairs), tuple(w for _, w in pairs))

    def check_width(self, width: int, owner: str, key: str = "model.matryoshka_dims", warn: bool = True) -> None:
        """Every width fits the `width`-wide representation; a list without the full width trains the full
        representation only through its prefixes (`warn`: say so, as sentence-transformers does)."""
        too_wide = [d for d in self.dims if d > width]
        if too_wide:
            raise ConfigError(f"{key}={list(self.dims)}: {too_wide[0]} is wider than {owner}'s {width}-dimensional "
                              f"representation; use widths <= {width}, e.g. [{width},{max(1, width // 3)}]")
        if warn and width not in self.dims:
            log.warning("%s=%s does not list the full width %d: the full representation is trained only through "
                        "its prefixes; add %d to train it as well", key, list(self.dims), width, width)

    def describe(self) -> dict:
        return {"dims": list(self.dims), "weights": list(self.weights)}

    def subset(self, indices: Sequence[int]) -> Matryoshka:
        """The widths at these positions (of `dims`, widest first) with their weights, in that order."""
        return Matryoshka(tuple(self.dims[i] for i in indices), tuple(self.weights[i] for i in indices))

    def loss(self, anchors: torch.Tensor, positives: torch.Tensor, hard_negatives: torch.Tensor | None,
             temperature: float, truncate: Truncate | None = None) -> torch.Tensor:
        """Σ_k w_k · InfoNCE of the first d_k components (`truncate(x, d)`, default `x[..., :d]`) of every row."""
        cut = truncate or (lambda tensor, dim: tensor[..., :dim])
        total = None
        for dim, weight in zip(self.dims, self.weights, strict=True):
            term = weight * info_nce(cut(anchors, dim), cut(positives, dim), temperature,
                                     None if hard_negatives is None else cut(hard_negatives, dim))
            total = term if total is None else total + term
        return total


# -- adaptive layers (2D Matryoshka) ---------------------------------------------------------------------------------

#: The views of one depth: (anchors, positives, hard negatives or None), each [b, D].
Views = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
#: How a prior layer's term is weighed, by its hidden-state index i (0 = the embedding output), as
#: AdaptiveLayerLoss's `layer_weighting`: uniform 1 (2DMSE, Starbucks), log 1 / (1 + ln(1 + i)) (ESE), linear
#: 1 / (1 + i) (what sentence-transformers did before the option existed).
LayerWeighting = Literal["uniform", "log", "linear"]
ADAPTIVE_KEY = "model.adaptive_layers"


@dataclass(frozen=True)
class LayerPlan:
    """One step's draw: the prior layers (in the order drawn) and, with Matryoshka widths, the positions of the
    widths each depth trains (the last layer's first, then each prior layer's; None without widths)."""

    num_layers: int
    layers: tuple[int, ...]
    widths: tuple[tuple[int, ...] | None, ...]

    @property
    def depths(self) -> tuple[int, ...]:
        """The last layer, then the prior layers drawn: the depths whose views the step computes."""
        return (self.num_layers, *self.layers)


@dataclass(frozen=True)
class AdaptiveLayers:
    """sentence-transformers' `AdaptiveLayerLoss` settings under their names (`Matryoshka2dLoss`'s with widths; see
    the module docstring). `n_layers_per_step`: prior layers drawn per step (-1: all); `n_dims_per_step`: widths
    drawn per depth and step, null meaning Matryoshka2dLoss's 1 (-1: all, = AdaptiveLayerLoss around
    MatryoshkaLoss); `prior_layers`: the layers that may be drawn (null: every one below the last, 0 = the
    embedding output, as sentence-transformers). The draws are Python `random.sample` calls in
    sentence-transformers' order: the last layer's widths, the layers, then each drawn layer's widths."""

    n_layers_per_step: int = 1
    n_dims_per_step: int | None = None
    last_layer_weight: NonNegative = 1.0
    prior_layers_weight: NonNegative = 1.0
    kl_div_weight: NonNegative = 1.0
    kl_temperature: NonNegative = 0.3
    layer_weighting: LayerWeighting = "uniform"
    prior_layers: Sequence[NonNegativeInt] | None = None

    @classmethod
    def build(cls, settings: Mapping | None, widths: int | None) -> AdaptiveLayers | None:
        """The settings of `model.adaptive_layers` (None: off), each value checked against its field's type, then
        against each other and the number of Matryoshka `widths` (None: none); one line per mistake."""
        if settings is None:
            return None
        if not isinstance(settings, Mapping):
            raise ConfigError(f"{ADAPTIVE_KEY}={settings!r}: give a map of AdaptiveLayerLoss settings, e.g. "
                              f"'{ADAPTIVE_KEY}={{n_layers_per_step: 1}}', or null")
        hints = typing.get_type_hints(cls, include_extras=True)
        for name, value in settings.items():
            if name not in hints:
                raise not_a_key(f"{ADAPTIVE_KEY}.{name}", hints, f"{ADAPTIVE_KEY} (AdaptiveLayerLoss's settings)")
            check_value(f"{ADAPTIVE_KEY}.{name}", value, hints[name])
        adaptive = cls(**{name: tuple(value) if isinstance(value, list) else value for name, value in settings.items()})
        adaptive.check(widths)
        return adaptive

    def check(self, widths: int | None) -> None:
        for name in ("n_layers_per_step", "n_dims_per_step"):
            count = getattr(self, name)
            if count is not None and count != -1 and count < 1:
                raise ConfigError(f"{ADAPTIVE_KEY}.{name}={count}: draw a count >= 1 per step, or -1 for all")
        if self.n_dims_per_step is not None:
            if widths is None:
                raise ConfigError(f"{ADAPTIVE_KEY}.n_dims_per_step={self.n_dims_per_step} draws Matryoshka widths, "
                                  "and model.matryoshka_dims is not set: set the widths or drop n_dims_per_step")
            if self.n_dims_per_step > widths:
                raise ConfigError(f"{ADAPTIVE_KEY}.n_dims_per_step={self.n_dims_per_step}: model.matryoshka_dims "
                                  f"lists {widths} width(s); draw at most {widths}, or -1 for all")
        if self.prior_layers is not None:
            if not self.prior_layers:
                raise ConfigError(f"{ADAPTIVE_KEY}.prior_layers=[] draws no layer; list layers below the last, or "
                                  "set it to null (every one)")
            if len(set(self.prior_layers)) != len(self.prior_layers):
                raise ConfigError(f"{ADAPTIVE_KEY}.prior_layers={list(self.prior_layers)} lists a layer twice; list "
                                  "each once")

    def check_depth(self, num_layers: int, owner: str) -> None:
        """The layers that may be drawn and their count against a model of `num_layers` transformer layers."""
        if self.prior_layers is not None and (beyond := [n for n in self.prior_layers if n >= num_layers]):
            raise ConfigError(f"{ADAPTIVE_KEY}.prior_layers={list(self.prior_layers)}: {owner}'s model has "
                              f"{num_layers} layers, so a prior layer is one of 0 (the embedding output) .. "
                              f"{num_layers - 1}; layer {beyond[0]} is not (the last, {num_layers}, always trains)")
        available = len(self.candidates(num_layers))
        if self.n_layers_per_step > available:
            raise ConfigError(f"{ADAPTIVE_KEY}.n_layers_per_step={self.n_layers_per_step}: {owner}'s model has "
                              f"{available} prior layer(s) to draw from; draw at most {available}, or -1 for all")

    def candidates(self, num_layers: int) -> list[int]:
        return sorted(self.prior_layers) if self.prior_layers is not None else list(range(num_layers))

    def describe(self) -> dict:
        return {field.name: (list(value) if isinstance(value := getattr(self, field.name), tuple) else value)
                for field in dataclasses.fields(self)}

    def widths_per_step(self) -> int:
        """Matryoshka2dLoss's default: one width per depth and step."""
        return 1 if self.n_dims_per_step is None else self.n_dims_per_step

    def draw(self, rng: random.Random, num_layers: int, widths: int | None) -> LayerPlan:
        """The step's prior layers and widths from `rng`, with the calls sentence-transformers' Matryoshka2dLoss
        makes on Python's `random` (so the same draw after `random.seed(s)` as `random.Random(s)` here)."""
        final = self._draw_widths(rng, widths)
        candidates = self.candidates(num_layers)
        layers = candidates
        if 0 < self.n_layers_per_step < len(candidates):
            layers = rng.sample(candidates, self.n_layers_per_step)
        return LayerPlan(num_layers, tuple(layers), (final, *(self._draw_widths(rng, widths) for _ in layers)))

    def _draw_widths(self, rng: random.Random, widths: int | None) -> tuple[int, ...] | None:
        if widths is None:
            return None
        chosen = range(widths)
        if 0 < self.widths_per_step() < widths:
            chosen = sorted(rng.sample(chosen, self.widths_per_step()))
        return tuple(chosen)

    def layer_weight(self, layer: int) -> float:
        if self.layer_weighting == "log":
            return 1.0 / (1.0 + math.log(1 + layer))
        if self.layer_weighting == "linear":
            return 1.0 / (1 + layer)
        return 1.0

    def loss(self, plan: LayerPlan, views: Sequence[Views],
             objective: Callable[[Views, tuple[int, ...] | None], torch.Tensor],
             representation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The objective over the plan's depths (`views[i]` those of `plan.depths[i]`; `objective(views, widths)`
        the recipe's loss of one depth's views on those widths) and the KL terms between the full-width
        `representation` of every row at each prior layer and at the last, in AdaptiveLayerLoss's order of
        operations. Rows are gathered from every rank, as InfoNCE's: the value is the joined batch's."""
        loss = objective(views[0], plan.widths[0]) * self.last_layer_weight
        if self.kl_temperature > 0:
            target = self._distribution(views[0], representation, log=False).detach()
        for layer, widths, layer_views in zip(plan.layers, plan.widths[1:], views[1:], strict=True):
            layer_loss = objective(layer_views, widths)
            loss = loss + layer_loss * self.layer_weight(layer) / len(plan.layers) * self.prior_layers_weight
            if self.kl_temperature > 0:
                with torch.autocast(device_type=target.device.type, enabled=False):
                    kl = F.kl_div(self._distribution(layer_views, representation, log=True), target,
                                  reduction="batchmean")
                loss = loss + kl * self.kl_temperature * self.kl_div_weight
        return loss

    def _distribution(self, views: Views, representation, log: bool) -> torch.Tensor:
        """softmax (or log_softmax) over the features of every row's full-width representation / T, in fp32."""
        rows = torch.cat([gather_with_grad(representation(view)) for view in views if view is not None])
        with torch.autocast(device_type=rows.device.type, enabled=False):
            scaled = rows.float() / self.kl_temperature
            return F.log_softmax(scaled, dim=-1) if log else F.softmax(scaled, dim=-1)


def layer_rng(seed: int, batch_index: int) -> random.Random:
    """The generator of one batch's draw: a function of the module's sampling seed and the batch's index in the run,
    so every rank draws the same layers (their rows are contrasted together) and a resumed run draws what the
    uninterrupted one would."""
    return random.Random(f"{seed}:{batch_index}")


class DepthPass:
    """One batch's views at every depth of a plan, from one forward per pooled call: the recipe's
    `contrastive_views` runs once per depth (`at`), the first (the whole model) computing its forwards with the
    states of every layer a depth's pooler reads and keeping their outputs; each later depth re-pools the same
    outputs, call by call, cut after its layer (`EncoderOutput.truncated`) — sentence-transformers' cache of the
    full forward. So dropout is drawn once, as there."""

    def __init__(self, depths: Sequence[int]):
        self.depths = tuple(depths)
        self.depth = self.depths[0]
        self.outputs: list[EncoderOutput] = []
        self.call = 0

    def at(self, depth: int) -> None:
        self.depth, self.call = depth, 0

    def output(self, layers: Sequence[int], forward: Callable[[tuple[int, ...]], EncoderOutput]) -> EncoderOutput:
        """`forward(layers)` at the whole model's depth (`layers`: what the pooler reads from the model's last
        layers, each depth's counted from that depth); the kept output cut at a prior depth."""
        if self.depth == self.depths[0]:
            wanted = {normalize_layer(layer, depth) for depth in self.depths for layer in layers}
            out = forward(tuple(sorted(wanted)))
            self.outputs.append(out)
            return out
        out = self.outputs[self.call]
        self.call += 1
        return out.truncated(self.depth)


def join_depths(per_depth: Sequence[Views]) -> Views:
    """Each column's views of every depth side by side ([b, depths × D]): gradient caching and the cross-rank
    gathering split and join rows, never features."""
    return tuple(None if column[0] is None else torch.cat(column, dim=-1)  # type: ignore[return-value]
                 for column in zip(*per_depth, strict=True))


def split_depths(views: Views, depths: int) -> list[Views]:
    """`join_depths` undone."""
    parts = [None if view is None else view.chunk(depths, dim=-1) for view in views]
    return [tuple(None if part is None else part[i] for part in parts) for i in range(depths)]  # type: ignore[misc]
