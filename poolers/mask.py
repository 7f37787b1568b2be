"""PromptBERT [MASK] pooling, optionally template-denoised and passed through a trained head."""

from __future__ import annotations

import torch
from torch import nn

from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.poolers.base import Needs, Pooler, masked_mean


class MaskPooler(Pooler):
    """e = g(h_M) − g(b_M(n)) if denoised (`head_after_denoise`: e = g(h_M − b_M(n))), else e = g(h_M), where
    h_M = (1/|M|) Σ_{t∈M} h^(l)_t.

    M = the template's [MASK] positions (several masks are averaged); h^(l) = layer `layer` (default last);
    PromptBERT Eq. 2 with h = h_[MASK]. Denoising (PromptBERT §5): b_M(n) is the [MASK] state of the template alone with
    positions shifted by the sentence length n (see encoder/forward.py). g = `head` (identity by default; the
    supervised recipe's MLM transform), applied to sentence and bias alike; or, `head_after_denoise` (the reference's
    supervised RoBERTa recipe: tanh(W(h − δ) + b)), to their difference.
    """

    def __init__(self, name: str = "mask", layer: int = -1, denoise: bool = False, head: nn.Module | None = None,
                 head_after_denoise: bool = False):
        super().__init__(name)
        self.layer = layer
        self.denoise = denoise
        self.head = head
        self.head_after_denoise = head_after_denoise

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, mask_token=True, template_bias=self.denoise)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        state = masked_mean(out.layer(self.layer), out.mask_token)
        head = self.head if self.head is not None else nn.Identity()
        if not self.denoise:
            return head(state)
        bias = out.template_bias[normalize_layer(self.layer, out.num_layers)]
        if self.head_after_denoise:
            return head(state - bias)
        return head(state) - head(bias)

    def describe(self) -> dict:
        described = {**super().describe(), "denoise": self.denoise,
                     "head": type(self.head).__name__ if self.head is not None else None}
        if self.head_after_denoise:
            described["head_after_denoise"] = True
        return described
