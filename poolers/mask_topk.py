"""PromptBERT's top-k MLM-token representation of the [MASK] state (Jiang et al. 2022, Eq. 3)."""

from __future__ import annotations

import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler, masked_mean


def decoder_matrix(mlm_head: torch.nn.Module, vocab_size: int) -> torch.Tensor:
    """The head's output projection W [V, D] (BERT/RoBERTa tie it to the input word-embedding table)."""
    linears = [m for m in mlm_head.modules() if isinstance(m, torch.nn.Linear) and m.out_features == vocab_size]
    if not linears:
        raise ConfigError(f"cannot find the vocabulary projection of {type(mlm_head).__name__}")
    return linears[-1].weight


class MaskTopKPooler(Pooler):
    """e = Σ_{v∈V_k} P(v|h) · W_v / Σ_{v∈V_k} P(v|h)  (PromptBERT Eq. 3).

    h = the [MASK] state of the templated input (averaged over [MASK]s, as `mask`), P = softmax of the MLM head
    applied to h, V_k = the k most probable tokens, W_v = the static token embedding of v (the head's decoder rows,
    tied to the input embeddings). Needs a checkpoint with trained MLM-head weights.
    """

    def __init__(self, name: str = "mask_topk", k: int = 100, layer: int = -1):
        super().__init__(name)
        if k < 1:
            raise ConfigError(f"mask_topk k must be >= 1, got {k}")
        self.k, self.layer = int(k), layer

    @property
    def needs(self) -> Needs:
        return Needs(layers=(self.layer,), templated=True, mask_token=True, mlm_head=True)

    def arguments(self) -> dict:
        return {"k": self.k}

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        state = masked_mean(out.layer(self.layer), out.mask_token)
        logits = out.mlm_head(state)
        top = torch.softmax(logits.float(), dim=-1).topk(min(self.k, logits.shape[-1]), dim=-1)
        table = decoder_matrix(out.mlm_head, logits.shape[-1])
        weights = top.values / top.values.sum(-1, keepdim=True)
        return torch.einsum("bk,bkd->bd", weights.to(table.dtype), table[top.indices])
