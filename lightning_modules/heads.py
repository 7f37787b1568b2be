"""Projection heads on top of the sentence representation."""

from __future__ import annotations

from torch import nn
from transformers.activations import ACT2FN


class MLPHead(nn.Module):
    """h -> tanh(W h + b): SimCSE/PromptBERT's unsupervised head (training only), and the head of the reference's
    supervised RoBERTa recipe (applied to the denoised state, in training and evaluation). `init_std`: W drawn as
    the reference's `init_weights` draws it (normal, the model's initializer_range; b = 0) instead of torch's
    default."""

    def __init__(self, hidden_size: int, init_std: float | None = None):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()
        if init_std is not None:
            nn.init.normal_(self.dense.weight, mean=0.0, std=init_std)
            nn.init.zeros_(self.dense.bias)

    def forward(self, hidden):
        return self.activation(self.dense(hidden))


class MLMTransformHead(nn.Module):
    """h -> LayerNorm(act(W h + b)): the transform of BERT's MLM head (PromptBERT's supervised head).

    Initialised from the checkpoint's MLM head (BERT's `cls.predictions.transform`, RoBERTa's `lm_head.dense` and
    `lm_head.layer_norm`) when it has one: see `promptemb.lightning_modules.base.mlm_transform_state`.
    """

    def __init__(self, hidden_size: int, activation: str = "gelu", eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = ACT2FN[activation]
        self.layer_norm = nn.LayerNorm(hidden_size, eps=eps)

    def forward(self, hidden):
        return self.layer_norm(self.activation(self.dense(hidden)))
