"""CoT-BERT (Zhang et al., "CoT-BERT: Enhancing Unsupervised Sentence Representation through Chain-of-Thought", ICANN
2024; ZBWpro/CoT-BERT): PromptBERT's unsupervised recipe with a two-stage template, a negative template and an
extended InfoNCE.

* Templates (comprehend, then summarise): `The sentence of "[X]" means [MASK] , so it can be summarized as [MASK] .`
  and its `:` variant are the two positive views; `The sentence : "[X]" does not mean [MASK] , so it cannot be
  summarized as [MASK] .` gives each sentence a negative view. The representation is the state of the SECOND
  [MASK] (mask_num 2, `[:, 1]`), in training and evaluation.
* Template denoising, training only (`--mask_embedding_sentence_delta_no_delta_eval`): from each view's [MASK]
  state the second [MASK] state of the same template with the sentence replaced by n [PAD] tokens, all attended
  (`models.denoising`; encoder/folded_forward.py `plan_pad_bias_rows`), then the MLP (dense + tanh, training only).
* Loss (`models.cl_forward`, num_sent 3): with h, h⁺ the two positive views and h⁻ the negative one, s = cos/τ,

      ℓ_i = −log e^{s(h_i, h⁺_i)} / Σ_j [e^{s(h_i, h⁺_j)} + e^{s(h_i, h⁻_j)} + e^{s(h⁺_i, h⁻_j)}]

  the third term contrasting the positive template with the negative one (the official weights on the hard
  negatives are commented out: every term counts once).

Kept as the official code does it (each with its clean variant):
* evaluation appends "." to a sentence not ending in . ? " ' and truncates nothing; training neither appends (the
  sentence alone is truncated to 32 tokens): `sentence_rule` (evaluation, "promptbert") and `train_sentence_rule`
  ("none"); clean: both the same;
* the denoising passes stay in the gradient graph (`mask_embedding_sentence_delta_freeze` off): `freeze_bias` false;
  clean: true;
* the reported runs compute one loss per DataParallel replica (2 GPUs x 128 of a 256 batch) and average them:
  `loss_groups` 2 in the recipe, each loss over its 1/groups of the global batch (`torch.chunk`); clean: 1.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F

from promptemb.common.bounds import AtLeastOne
from promptemb.common.errors import ConfigError
from promptemb.encoder.folded_forward import BiasRows, plan_pad_bias_rows, training_forward
from promptemb.encoder.forward import position_base
from promptemb.encoder.inputs import PAD, Batch, InputBuilder, InputForm
from promptemb.encoder.template import MASK_SLOT, SentenceRule, Template
from promptemb.lightning_modules.base import PromptContrastiveModule
from promptemb.lightning_modules.heads import MLPHead
from promptemb.lightning_modules.losses import gather_with_grad
from promptemb.lightning_modules.recipe import register_recipe
from promptemb.poolers import build_pooler
from promptemb.poolers.base import Pooler
from promptemb.poolers.mask import MaskPooler

COTBERT_TEMPLATES = ('The sentence of "[X]" means [MASK] , so it can be summarized as [MASK] .',
                     'The sentence : "[X]" means [MASK] , so it can be summarized as [MASK] .')
COTBERT_NEGATIVE_TEMPLATE = 'The sentence : "[X]" does not mean [MASK] , so it cannot be summarized as [MASK] .'
#: [MASK]s of every CoT-BERT template: the first one comprehends, the second one (`POOLED_MASK`) is the sentence
MASKS = 2
POOLED_MASK = -1


def cotbert_logits(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """[b, 3b]: [cos(h_i, h⁺_j) | cos(h_i, h⁻_j) | cos(h⁺_i, h⁻_j)] / τ (`cl_forward`'s `cos_sim`, num_sent 3)."""
    a, p, n = (F.normalize(t.float(), dim=-1) for t in (anchors, positives, negatives))
    return torch.cat([a @ p.T, a @ n.T, p @ n.T], dim=1) / temperature


def cotbert_loss(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor, temperature: float = 0.05,
                 groups: int = 1) -> torch.Tensor:
    """CoT-BERT's InfoNCE (module docstring) over the GLOBAL batch (rows gathered from every rank, the local slice
    differentiable, as `losses.info_nce`), or the mean of its value on `groups` consecutive chunks of it
    (`torch.chunk`: DataParallel's scatter, one loss per replica)."""
    a, p, n = (gather_with_grad(t) for t in (anchors, positives, negatives))
    # in fp32 under autocast: cos/τ reaches 1/τ = 20, where bf16 steps by 0.125
    with torch.autocast(device_type=a.device.type, enabled=False):
        losses = [F.cross_entropy(cotbert_logits(ga, gp, gn, temperature), torch.arange(ga.shape[0], device=a.device))
                  for ga, gp, gn in zip(a.chunk(groups), p.chunk(groups), n.chunk(groups), strict=True)]
        return torch.stack(losses).mean()


@register_recipe("cotbert_unsup")
class CoTBERT(PromptContrastiveModule):
    """Two positive templates (template.text, template.second_text) and a negative one (`negative_template`), the
    second [MASK] of each denoised with the [PAD]-filled template (training only), an MLP (training only) and the
    extended InfoNCE; evaluation: `eval_template` (default: the first), its second [MASK], no denoising, no MLP."""

    template_views = 2

    @classmethod
    def check_config(cls, settings: dict) -> None:
        super().check_config(settings)
        if settings.get("matryoshka_dims"):
            raise ConfigError("CoTBERT trains its own InfoNCE, not the Matryoshka sum; drop model.matryoshka_dims")
        texts = [*(settings.get("templates") or ()), settings.get("negative_template"), settings.get("eval_template")]
        for text in (t for t in texts if isinstance(t, str)):
            if text.count(MASK_SLOT) != MASKS:
                raise ConfigError(
                    f"CoTBERT needs exactly {MASKS} {MASK_SLOT}s in each template (the first comprehends, the "
                    f"second is pooled); {text!r} has {text.count(MASK_SLOT)}; e.g. {COTBERT_TEMPLATES[0]!r} "
                    "(template=cotbert_bert_pair)")

    def __init__(self, model_name_or_path: str, templates: list[str] = COTBERT_TEMPLATES,
                 negative_template: str = COTBERT_NEGATIVE_TEMPLATE, train_sentence_rule: SentenceRule = "none",
                 sentence_rule: SentenceRule = "promptbert", loss_groups: AtLeastOne = 1, **kwargs):
        """`sentence_rule`: the rule of evaluation (what scores, exports and `encode` apply); `train_sentence_rule`:
        the rule of the training views. `loss_groups`: the loss is the mean over this many chunks of the global
        batch, each its own InfoNCE (1: the whole batch)."""
        type(self).check_config({"templates": list(templates), "negative_template": negative_template,
                                 "eval_template": kwargs.get("eval_template"),
                                 "matryoshka_dims": kwargs.get("matryoshka_dims")})
        super().__init__(model_name_or_path, list(templates), sentence_rule=sentence_rule, **kwargs)
        self.negative_template = Template(negative_template)
        self.builders.append(self._builder(self.negative_template, self.hparams.max_sentence_tokens))
        config = self.transformer.config
        # cl_init's init_weights: normal(0, initializer_range), bias 0
        self.mlp = MLPHead(config.hidden_size, init_std=getattr(config, "initializer_range", 0.02))
        self.train_pooler = MaskPooler("mask", denoise=self.hparams.denoise, which_mask=POOLED_MASK)

    def _builder(self, template: Template, max_sentence_tokens: int | None) -> InputBuilder:
        form = InputForm(template, self.hparams.train_sentence_rule, max_sentence_tokens)
        return InputBuilder(self.tokenizer, form, self.max_length)

    def _padding_idx(self) -> int | None:
        base = position_base(self.transformer)
        return base - 1 if base else None

    def plan_template_bias(self, builders: list[InputBuilder], lengths: list[torch.Tensor], width: int) -> BiasRows:
        """The [PAD]-filled template rows of the batch's sentence lengths, read at the second [MASK]."""
        rows = None
        if self.length_buckets:  # a compiled step: every length the width allows, one shape per width
            rows = [min(b.max_sentence_tokens, width - 2 - len(b.prefix_ids) - len(b.suffix_ids)) + 1
                    for b in builders]
        return plan_pad_bias_rows(builders, lengths, width, self._padding_idx(), self.tokenizer.pad_token_id,
                                  self.device, mask=POOLED_MASK, rows=rows)

    def compute_template_biases(self, builders: list[InputBuilder], lengths: list[torch.Tensor],
                                layers: tuple[int, ...] = (-1,)) -> list[dict[int, torch.Tensor]]:
        """The same biases for given lengths (gradient caching's bias cache), one forward of their rows alone."""
        width = max(2 + len(b.prefix_ids) + len(b.suffix_ids) + int(n.max()) for b, n in zip(builders, lengths,
                                                                                          strict=True))
        rows = plan_pad_bias_rows(builders, lengths, width, self._padding_idx(), self.tokenizer.pad_token_id,
                                  self.device, mask=POOLED_MASK)
        empty = torch.zeros(0, width, dtype=torch.long, device=self.device)
        no_sentences = Batch(input_ids=empty, attention_mask=empty, roles=torch.full_like(empty, PAD),
                             mask_token=empty.bool(), sentence_lengths=empty[:, 0])
        with torch.no_grad() if self.hparams.freeze_bias else contextlib.nullcontext():
            out = training_forward(self.transformer, no_sentences, layers, bias_rows=rows,
                                   input_embedder=self.input_embedder)
        sizes = [len(n) for n in lengths]
        parts = {layer: bias.split(sizes) for layer, bias in out.template_bias.items()}
        return [{layer: parts[layer][view] for layer in parts} for view in range(len(builders))]

    def contrastive_views(self, batch):
        """(MLP of the first view, of the second, of the negative view), each [b, D]."""
        first, second, negative = (self.mlp(view) for view in
                                   self.pooled_views(batch, self.builders, self.train_pooler))
        return first, second, negative

    def contrastive_objective(self, anchors, positives, negatives):
        return cotbert_loss(anchors, positives, negatives, self.hparams.temperature, self.hparams.loss_groups)

    def eval_poolers(self) -> list[Pooler]:
        return [MaskPooler("mask", which_mask=POOLED_MASK), build_pooler("avg")]

    @classmethod
    def check_encoding_options(cls, path: Path, hyper_parameters: dict, *, pooler: str | None = None,
                               denoise: bool | None = None, adapter: str | None = None) -> None:
        """Encoded as evaluated (`encoding_spec`: the second [MASK], undenoised); denoising is refused: CoT-BERT's bias
        is the [PAD]-filled template's, which the inference encoders do not compute."""
        super().check_encoding_options(path, hyper_parameters, pooler=pooler, denoise=denoise, adapter=adapter)
        if denoise:
            raise ConfigError(f"{path} is a CoTBERT checkpoint: it denoises in training only (with the [PAD]-filled "
                              "template, which inference does not compute); drop denoise=")
