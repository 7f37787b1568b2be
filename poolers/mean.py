"""Mean pooling over tokens of an average of layers: `mean`, `first_last`, multi-layer averages and templated `avg`."""

from __future__ import annotations

import torch

from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler, masked_mean, pooled_tokens, require_template_for


class MeanPooler(Pooler):
    """e = (1/|T|) Σ_{t∈T} (1/|K|) Σ_{k∈K} h^(k)_t.

    T = every non-padding token, [CLS]/[SEP] included (as sentence-transformers' mean pooling); K = `layers`
    (0 = embedding output, L = last layer). Named variants:
    * `mean`: K = {L}.
    * `first_last`: K = {1, L} (SimCSE's current "first-last avg"; the original papers' 56.70 used K = {0, L},
      so name the layers explicitly when comparing: `pooler_args.first_last.layers=[0,-1]`).
    * `avg`: K = {L} over the whole prompt-templated input, template and [MASK] tokens included (PromptBERT Table 1).
    * `avg_no_mask`: `avg` with T = every templated token except the [MASK] tokens (`include_mask=False`).
    """

    def __init__(self, name: str = "mean", layers: tuple[int, ...] | list[int] = (-1,), templated: bool = False,
                 include_mask: bool = True):
        super().__init__(name)
        require_template_for(name, templated, include_mask)
        self.layers = tuple(layers)
        self.templated = templated
        self.include_mask = include_mask

    @property
    def needs(self) -> Needs:
        return Needs(layers=self.layers, templated=self.templated, mask_token=not self.include_mask)

    def arguments(self) -> dict:
        return {"include_mask": self.include_mask} if self.templated else {}

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        states = torch.stack([out.layer(k) for k in self.layers]).mean(0)
        return masked_mean(states, pooled_tokens(out, self.include_mask))
