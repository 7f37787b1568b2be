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
        embeds = word_embeddings(batch.input_ids)
        slots = batch.roles == TEMPLATE
        per_row = slots.sum(1)
        if not bool(per_row.any()):
            return embeds
        if not bool((per_row == len(self.vectors)).all()):
            raise ValueError(
                f"rows carry {per_row.tolist()} template tokens; the soft template has {len(self.vectors)}"
            )
        rows, cols = slots.nonzero(as_tuple=True)  # row-major: the k-th hit of a row is its k-th template token
        soft = self.vectors.to(embeds.dtype).repeat(batch.input_ids.shape[0], 1)
        keep_plain = self.is_mask.repeat(batch.input_ids.shape[0]).unsqueeze(-1)
        values = torch.where(keep_plain, embeds[rows, cols], soft)
        return embeds.index_put((rows, cols), values)
