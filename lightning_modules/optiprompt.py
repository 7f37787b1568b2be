"""OptiPrompt: frozen encoder, trainable soft template, unsupervised contrastive objective."""

from __future__ import annotations

from promptemb.lightning_modules.base import PromptContrastiveModule
from promptemb.lightning_modules.recipe import register_recipe
from promptemb.lightning_modules.soft_template import SoftTemplate
from promptemb.poolers import build_pooler
from promptemb.poolers.base import Pooler
from promptemb.poolers.mask import MaskPooler


@register_recipe("optiprompt")
class OptiPrompt(PromptContrastiveModule):
    """The encoder's weights are frozen; the template tokens become trainable vectors (`SoftTemplate`) initialised
    from the manual template's word embeddings and written into `inputs_embeds` at the template's positions. Two
    dropout views of the same soft-templated sentence are contrasted with InfoNCE; only the soft template trains."""

    def __init__(self, model_name_or_path: str, template: str = 'This sentence : "[X]" means [MASK] .', **kwargs):
        kwargs.setdefault("denoise", False)
        super().__init__(model_name_or_path, [template], **kwargs)
        self.transformer.requires_grad_(False)
        builder = self.builders[0]
        self.soft_template = SoftTemplate(builder.prefix_ids + builder.suffix_ids, self.tokenizer.mask_token_id,
                                          self.transformer.get_input_embeddings())
        self.input_embedder = self.soft_template
        self.pooler = MaskPooler("mask", denoise=self.hparams.denoise)

    def contrastive_views(self, batch: list[str]):
        first = self.pooled(batch, self.builders[0], self.pooler)
        second = self.pooled(batch, self.builders[0], self.pooler)
        return first, second, None

    def eval_poolers(self) -> list[Pooler]:
        return [self.pooler, build_pooler("avg")]
