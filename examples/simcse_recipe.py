"""Unsupervised SimCSE (Gao et al. 2021, "SimCSE: Simple Contrastive Learning of Sentence Embeddings") as a recipe of
your own, written outside promptemb: each sentence of the batch is encoded twice (dropout makes the two views
differ), the [CLS] states go through an MLP (training only) and InfoNCE contrasts them (τ = 0.05); a checkpoint is
scored and exported with the plain [CLS] state.

    python train.py hydra.searchpath=[file://$PWD/configs] experiment=quickstart_simcse imports=[simcse_recipe]

(docs/extending.md walks through it.)
"""

from __future__ import annotations

import torch

from promptemb.lightning_modules.base import PromptContrastiveModule
from promptemb.lightning_modules.heads import MLPHead
from promptemb.lightning_modules.recipe import register_recipe
from promptemb.poolers import Pooler, build_pooler
from promptemb.poolers.cls import CLSPooler


@register_recipe("simcse_unsup")
class SimCSE(PromptContrastiveModule):
    template_views = 0  # no template: the plain sentence, `[CLS] sentence [SEP]` (train.py's template=none)
    requires_mask = False  # it pools [CLS], not a [MASK]

    def __init__(self, model_name_or_path: str, temperature: float = 0.05, max_sentence_tokens: int = 32,
                 **kwargs):
        super().__init__(model_name_or_path, ["[X]"], temperature=temperature, denoise=False,
                         max_sentence_tokens=max_sentence_tokens, **kwargs)
        self.mlp = MLPHead(self.transformer.config.hidden_size)  # SimCSE's unsupervised head: training only
        self.pooler = CLSPooler("cls")

    def contrastive_views(self, batch: list[str]) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Two dropout views of every sentence, in one forward (the framework stacks them), through the MLP."""
        first, second = self.pooled_views(batch, self.builders * 2, self.pooler)
        return self.mlp(first), self.mlp(second), None

    def eval_poolers(self) -> list[Pooler]:
        """What checkpoints are scored (and selected) with, first the one an export uses: [CLS], then the mean."""
        return [self.pooler, build_pooler("mean")]
