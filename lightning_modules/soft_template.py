"""OptiPrompt's soft template: trainable vectors in place of the manual template's word embeddings."""

from __future__ import annotations

import torch
from torch import nn

from promptemb.encoder.inputs import TEMPLATE, Batch


class SoftTemplate(nn.Module):
    """e_t = v_k for the k-th template token t of a row (k over prefix then suffix), else E[x_t].

    Positions come from the token roles the input builder wrote by offset ([CLS] + prefix + sentence + suffix), never
    from searching token ids, so a template word that also occurs in the sentence keeps its plain embedding.
    [MASK] slots keep the mask token's embedding (mask pooling reads them); every other template token is trainable,
    initialised from the manual template's word embeddings. Inputs without template tokens pass through unchanged.
    """

    def __init__(self, template_ids: list[int], mask_token_id: int | None, word_embeddings: nn.Embedding):
        super().__init__()
        ids = torch.tensor(template_ids, dtype=torch.long)
        self.vectors = nn.Parameter(word_embeddings.weight.detach()[ids].clone())
        self.register_buffer("is_mask", ids == mask_token_id if mask_token_id is not None else ids < 0,
                             persistent=False)

    def forward(self, batch: Batch, word_embeddings: nn.Embedding) -> torch.Tensor:
        """Rows may hold several template-only segments (encoder/folded_forward.py): the template tokens of a row are
        counted along it, modulo the template's length, so each segment's k-th one gets v_k. Sync-free: nothing is
        read back from the device (a row whose template-token count is no multiple of the template's length fails a
        device-side assertion)."""
        embeds = word_embeddings(batch.input_ids)
        slots = batch.roles == TEMPLATE
        count = len(self.vectors)
        torch._assert_async((slots.sum(1) % count == 0).all(),
                            f"a row carries template tokens that are not whole copies of the {count}-token template")
        k = (slots.cumsum(1) - 1).remainder(count)  # [B, T]: which template token each slot is
        soft = slots & ~self.is_mask[k]  # [MASK] slots keep the mask token's embedding
        return torch.where(soft.unsqueeze(-1), self.vectors.to(embeds.dtype)[k], embeds)
