"""PromptBERT [MASK] pooling, optionally template-denoised and passed through a trained head."""

from __future__ import annotations

import torch
from torch import nn

from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.poolers.base import Needs, Pooler, masked_mean


class MaskPooler(Pooler):
    """e = g(h_M) − g(b_M(n)) if denoised (`head_after_denoise`: e = g(h_M − b_M(n))), else e = g(h_M), where
    h_M = (1/|M|) Σ_{t∈M} h^(l)_t.

    M = the template's [MASK] positions (several masks are averaged), or only the `which_mask`-th of them (0 the
    first, -1 the last: CoT-BERT pools the second of its two); h^(l) = layer `layer` (default last);
    PromptBERT Eq. 2 with h = h_[MASK]. Denoising (PromptBERT §5): b_M(n) is the [MASK] state of the template alone with
    positions shifted by the sentence length n (see encoder/forward.py). g = `head` (identity by default; the
    supervised recipe's MLM transform), applied to sentence and bias alike; or, `head_after_denoise` (the reference's
    supervised RoBERTa recipe: tanh(W(h − δ) + b)), to their difference. With `which_mask`, the bias subtracted must be
    that [MASK]'s too: the training forward plans it so for CoT-BERT (its recipe's `plan_template_bias`); the
    evaluation encoder's template bias is the mean over the template's masks.
    """

    def __init__(self, name: str = "mask", layer: int = -1, denoise: bool = False, head: nn.Module | None = None,
                 head_after_denoise: bool = False, which_mask: int | None = None):
        super().__init__(name)
        self.layer = layer
        self.denoise = denoise
        self.head = head
        self.head_after_denoise = head_after_denoise
        self.which_mask = which_mask

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, mask_token=True, template_bias=self.denoise)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        state = masked_mean(out.layer(self.layer), self.pooled_masks(out.mask_token))
        head = self.head if self.head is not None else nn.Identity()
        if not self.denoise:
            return head(state)
        bias = out.template_bias[normalize_layer(self.layer, out.num_layers)]
        if self.head_after_denoise:
            return head(state - bias)
        return head(state) - head(bias)

    def pooled_masks(self, mask_token: torch.Tensor) -> torch.Tensor:
        """[B, T] bool: the [MASK] tokens pooled, every one or the `which_mask`-th of each row."""
        if self.which_mask is None:
            return mask_token
        rank = mask_token.cumsum(1)  # 1 at a row's first [MASK], 2 at its second, ...
        wanted = self.which_mask + 1 if self.which_mask >= 0 else rank[:, -1:] + self.which_mask + 1
        return mask_token & (rank == wanted)

    def arguments(self) -> dict:
        return {} if self.which_mask is None else {"which_mask": self.which_mask}

    def describe(self) -> dict:
        described = {**super().describe(), "denoise": self.denoise,
                     "head": type(self.head).__name__ if self.head is not None else None}
        if self.head_after_denoise:
            described["head_after_denoise"] = True
        return described
