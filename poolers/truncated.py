"""A pooler on the model cut after an earlier layer: how a model trained with adaptive layers (2D Matryoshka, Li et
al. 2024) is scored at each depth, as sentence-transformers evaluates one (its layer list truncated)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.poolers.base import Needs, Pooler
from promptemb.poolers.fitted import CorpusFittedPooler
from promptemb.poolers.registry import LAYER_SEPARATOR


class TruncatedPooler(Pooler):
    """`inner` on the output of the same forward cut after layer `depth` (0 = the embedding output;
    `EncoderOutput.truncated`): every layer it reads counted from that depth, so where it reads the last layer it
    reads layer `depth`, and its template biases, heads and input form are its own. Named `NAME@DEPTH`: for a pooler
    of the last layer alone, the registry's `NAME@LAYER` at that layer, the same embeddings."""

    def __init__(self, inner: Pooler, depth: int):
        super().__init__(f"{inner.name}{LAYER_SEPARATOR}{depth}")
        needs = inner.needs
        unsupported = ("attentions" if needs.attentions else "word-embedding rows" if needs.word_embeddings else
                       "the MLM head" if needs.mlm_head else "router logits" if needs.router_logits else
                       "a corpus fit" if isinstance(inner, CorpusFittedPooler) else
                       "the embeddings of its parts" if inner.parts() else None)
        if unsupported or not (needs.layers or needs.layers_from is not None):
            why = f"reads {unsupported}" if unsupported else "reads no layer"
            raise ConfigError(f"pooler {inner.name!r} {why}, so it is not scored at an earlier layer: score it in a "
                              "run without layers=[...]")
        if LAYER_SEPARATOR in inner.name:
            raise ConfigError(f"pooler {inner.name!r} names its layer, and layers=[...] cuts the model under every "
                              f"pooler: list {inner.name.partition(LAYER_SEPARATOR)[0]!r} instead, or drop layers")
        self.inner, self.depth = inner, depth
        try:
            layers = {normalize_layer(layer, depth) for layer in needs.layers}
            if needs.layers_from is not None:
                layers.update(range(normalize_layer(needs.layers_from, depth), depth + 1))
        except ConfigError as err:
            raise ConfigError(f"pooler {inner.name!r} at layer {depth}: {err}") from None
        self._needs = dataclasses.replace(needs, layers=tuple(sorted(layers)), layers_from=None)

    @property
    def needs(self) -> Needs:
        return self._needs

    @property
    def label(self) -> str:
        return f"{self.inner.label}{LAYER_SEPARATOR}{self.depth}"

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        return self.inner(out.truncated(self.depth))

    def check_model(self, config) -> None:
        self.inner.check_model(config)

    def input_form(self):
        return self.inner.input_form()

    def bind_tokenizer(self, tokenizer) -> None:
        self.inner.bind_tokenizer(tokenizer)

    def bind_encoder(self, encoder) -> None:
        self.inner.bind_encoder(encoder)

    def describe(self) -> dict:
        return {**self.inner.describe(), "layers": list(self._needs.layers), "depth": self.depth}


def check_depths(depths: Sequence[int], dims: Sequence[int]) -> None:
    """evaluate.py's `layers` before the model loads: none twice, none also a width (`dims`: rows `pooler@d` would
    be the pooler at that layer and at that width alike); the model's depth is checked once it loads."""
    if len(set(depths)) != len(depths):
        raise ConfigError(f"layers={list(depths)} lists a layer twice; list each once")
    if shared := sorted(set(depths) & set(dims)):
        raise ConfigError(f"layers={list(depths)} and dims={list(dims)} share {shared[0]}: rows pooler@{shared[0]} "
                          "would be the pooler at that layer and at that width alike; score them in two runs")


def at_depths(poolers: Sequence[Pooler], depths: Sequence[int], num_layers: int) -> list[Pooler]:
    """Each pooler, then the same pooler at each of `depths` (deepest first) of a model of `num_layers` layers:
    the rows of a layers x widths table with `dims`."""
    if beyond := [depth for depth in depths if depth >= num_layers]:
        raise ConfigError(f"layers={list(depths)}: the model has {num_layers} layers, so a layer to cut after is one "
                          f"of 0 (the embedding output) .. {num_layers - 1} (the whole model is each pooler's own "
                          f"row); {beyond[0]} is not")
    return [variant for pooler in poolers
            for variant in (pooler, *(TruncatedPooler(pooler, depth) for depth in sorted(depths, reverse=True)))]
