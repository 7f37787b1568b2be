"""What one forward pass hands to the poolers."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from promptemb.common.errors import ConfigError


def normalize_layer(index: int, num_layers: int) -> int:
    """Map a layer index to 0..L: `0` is the embedding output, `1..L` the transformer layers, negatives count back."""
    if not -(num_layers + 1) <= index <= num_layers:
        raise ConfigError(
            f"layer {index} is out of range for a model with {num_layers} layers; "
            f"valid: 0 (embeddings) .. {num_layers}, or {-(num_layers + 1)} .. -1"
        )
    return index % (num_layers + 1)


@dataclass
class EncoderOutput:
    """Hidden states of the layers some pooler asked for, plus token metadata; all tensors are batch-first.

    `hidden_states` maps normalised layer index (0 = embedding output, L = last layer) to `[B, T, D]`;
    `attentions` holds per-layer attention probabilities `[B, H, T, T]` (layer 1..L at index 0..L-1) when asked for;
    `word_embeddings` holds rows of the input word-embedding table `[B, T, D]` (no position/segment, no LayerNorm);
    `router_logits` holds, for each mixture-of-experts block in order, its router's logits `[B, T, E]` (before any
    softmax or top-k) when asked for.
    """

    num_layers: int
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    roles: torch.Tensor
    mask_token: torch.Tensor
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)
    attentions: tuple[torch.Tensor, ...] | None = None
    word_embeddings: torch.Tensor | None = None
    mlm_head: torch.nn.Module | None = None
    template_bias: dict[int, torch.Tensor] | None = None  # layer -> [B, D] bias of the template at each row's length
    router_logits: tuple[torch.Tensor, ...] | None = None

    def in_float32(self) -> EncoderOutput:
        """The same output with every floating tensor in float32 (after a forward under autocast: the poolers then
        average, weight and subtract in float32)."""

        def cast(tensor):
            return tensor.float() if tensor is not None and tensor.is_floating_point() else tensor

        self.hidden_states = {layer: cast(states) for layer, states in self.hidden_states.items()}
        self.attentions = None if self.attentions is None else tuple(cast(a) for a in self.attentions)
        self.word_embeddings = cast(self.word_embeddings)
        self.router_logits = None if self.router_logits is None else tuple(cast(r) for r in self.router_logits)
        if self.template_bias is not None:
            self.template_bias = {layer: cast(bias) for layer, bias in self.template_bias.items()}
        return self

    def layer(self, index: int) -> torch.Tensor:
        return self.hidden_states[normalize_layer(index, self.num_layers)]

    def truncated(self, depth: int) -> EncoderOutput:
        """The output of the same forward with the model cut after layer `depth` (0: the embedding output): the
        states, template biases and attentions of layers 0..depth, layer `depth` now the last (`-1`), so a pooler
        re-pools it as the model's output (sentence-transformers' `AdaptiveLayerLoss` re-runs its pooling on an
        intermediate layer's states the same way). A decoder's intermediate states are the raw layer outputs (the
        final norm follows the last layer only)."""
        normalize_layer(depth, self.num_layers)
        if not 0 <= depth <= self.num_layers:
            raise ConfigError(f"depth {depth}: a model with {self.num_layers} layers is cut after one of layers "
                              f"0 .. {self.num_layers}")
        if depth == self.num_layers:
            return self
        return replace(
            self, num_layers=depth,
            hidden_states={layer: states for layer, states in self.hidden_states.items() if layer <= depth},
            attentions=None if self.attentions is None else self.attentions[:depth],
            template_bias=None if self.template_bias is None else {
                layer: bias for layer, bias in self.template_bias.items() if layer <= depth})
