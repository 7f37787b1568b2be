"""What PromptBERT (unsupervised, supervised) and OptiPrompt share: model loading, templated views, InfoNCE, optimiser.

Subclasses say which views to contrast (`contrastive_views`) and how a checkpoint is scored (`eval_poolers`,
`eval_template`). Every representation goes through `encoder.forward.run_transformer` and a pooler from `poolers/`,
the same code evaluate.py and the exports use.
"""

from __future__ import annotations

import contextlib
import functools
import random
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.enums import GradClipAlgorithmType
from torch.optim.lr_scheduler import LRScheduler

from promptemb.common.bounds import AtLeastOne, Positive, TokenLimit
from promptemb.common.device_profile import profile_of
from promptemb.common.errors import ConfigError, DivergenceError
from promptemb.data.pretokenized import SentenceTokenization
from promptemb.encoder.folded_forward import BiasRows, bias_rows_needed, plan_bias_rows, training_forward
from promptemb.encoder.forward import concat_batches, max_input_length, position_base, template_biases
from promptemb.encoder.inputs import Batch, InputBuilder, InputForm, collate
from promptemb.encoder.loading import load_pretrained
from promptemb.encoder.model import BATCH_SIZE, Encoder
from promptemb.encoder.template import SentenceRule, Template
from promptemb.lightning_modules.checkpoint import rebuild_with_weights
from promptemb.lightning_modules.grad_cache import GradCache, TemplateBiasCache, check_grad_cache_precision
from promptemb.lightning_modules.losses import info_nce, world_size
from promptemb.lightning_modules.matryoshka import (
    AdaptiveLayers,
    DepthPass,
    LayerPlan,
    Matryoshka,
    Views,
    check_matryoshka_settings,
    configured_depth,
    configured_width,
    join_depths,
    layer_rng,
    split_depths,
)
from promptemb.lightning_modules.recipe import RECORD_KEY, EncodingSpec, RecipeConstruction, recipe_record
from promptemb.lightning_modules.schedules import linear_warmup_decay
from promptemb.poolers.base import Pooler
from promptemb.poolers.cls import CLSPooler
from promptemb.poolers.mask import MaskPooler
from promptemb.poolers.mean import MeanPooler

#: The optimiser and schedule when none is passed (configs/optimizer/adamw.yaml, configs/scheduler/linear.yaml).
DEFAULT_OPTIMIZER = functools.partial(torch.optim.AdamW, lr=1e-5, weight_decay=0.0)
DEFAULT_SCHEDULER = functools.partial(linear_warmup_decay, warmup_ratio=0.0)

# `transfer_batch_to_device` is overridden on purpose (it keeps the loader's lengths in host memory too); Lightning
# warns about any override of that hook when a datamodule is passed.
warnings.filterwarnings("ignore", message="You have overridden `transfer_batch_to_device` in `LightningModule`")

#: Where *ForMaskedLM models keep the MLM head's transform (dense -> activation -> LayerNorm): (module, LayerNorm name).
MLM_TRANSFORMS = (("cls.predictions.transform", "LayerNorm"), ("lm_head", "layer_norm"))  # BERT; RoBERTa, XLM-R


def mlm_transform_state(model: torch.nn.Module, loading_info: dict) -> dict[str, torch.Tensor] | None:
    """Copies of the trained MLM-head transform weights of a *ForMaskedLM model, keyed as `MLMTransformHead`'s
    state dict (`dense.*`, `layer_norm.*`), or None when it has no such transform or the checkpoint did not provide
    it (randomly initialised)."""
    missing = tuple(loading_info.get("missing_keys", ()))
    for path, norm in MLM_TRANSFORMS:
        try:
            transform = model.get_submodule(path)
            parts = {"dense": transform.get_submodule("dense"), "layer_norm": transform.get_submodule(norm)}
        except AttributeError:
            continue
        if any(key.startswith((f"{path}.dense.", f"{path}.{norm}.")) for key in missing):
            return None
        return {f"{name}.{key}": tensor.detach().clone()
                for name, part in parts.items() for key, tensor in part.state_dict().items()}
    return None


def export_kind(pooler: Pooler) -> str | None:
    """The export form of an evaluation pooler: its [MASK] state, its [CLS] state, or a mean over the (templated)
    input; None for any other."""
    if isinstance(pooler, MaskPooler):
        return "mask"
    if isinstance(pooler, CLSPooler):
        return "cls"
    if isinstance(pooler, MeanPooler) and len(pooler.layers) == 1 and pooler.include_mask:
        return "avg"
    return None


class NonFiniteLossError(DivergenceError):
    """The loss became NaN/inf; training stops before the optimiser step, so saved checkpoints stay good."""


class PromptContrastiveModule(RecipeConstruction, pl.LightningModule):
    #: How many templates (views) the recipe trains with: the length of `templates` it accepts; 0: none from the
    #: template config, the recipe reads the plain sentence (`templates` is then its one input form, `[X]`).
    template_views: int = 1
    #: Whether the recipe reads a [MASK] slot (its templates and the tokenizer must have one); DCPCSE pools [CLS].
    requires_mask: bool = True
    #: Adaptive layers (lightning_modules/matryoshka.py; None: off), the step's draw, and while the views of a step
    #: are computed, the pass over its depths (`training_views`)
    adaptive_layers: AdaptiveLayers | None = None
    layer_plan: LayerPlan | None = None
    depth_pass: DepthPass | None = None

    @classmethod
    def check_config(cls, settings: dict) -> None:
        """Settings that would be accepted and change nothing, refused before anything loads (train.py's config check
        runs it on the `model` node)."""
        if settings.get("freeze_bias") and not settings.get("denoise", True):
            raise ConfigError("model.freeze_bias=true stops the gradient through the template bias that denoising "
                              "subtracts; with model.denoise=false there is none: drop model.freeze_bias")
        check_matryoshka_settings(settings.get("matryoshka_dims"), settings.get("matryoshka_weights"))
        if settings.get("matryoshka_dims") and (width := configured_width(settings.get("model_name_or_path"))):
            Matryoshka.build(settings["matryoshka_dims"]).check_width(width, cls.__name__, warn=False)
        adaptive = cls.build_adaptive_layers(settings.get("adaptive_layers"), settings.get("matryoshka_dims"))
        if adaptive is not None and (depth := configured_depth(settings.get("model_name_or_path"))):
            adaptive.check_depth(depth, cls.__name__)

    @staticmethod
    def build_adaptive_layers(settings, dims) -> AdaptiveLayers | None:
        return AdaptiveLayers.build(settings, len(dims) if dims else None)

    def __init__(
        self,
        model_name_or_path: str,
        templates: list[str],
        eval_template: str | None = None,
        temperature: Positive = 0.05,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        scheduler: Callable[..., LRScheduler] | None = None,
        max_sentence_tokens: AtLeastOne = 32,
        sentence_rule: SentenceRule = "none",
        denoise: bool = True,
        freeze_bias: bool = False,
        load_mlm_head: bool = False,
        max_length: TokenLimit | None = None,
        grad_cache_chunk_size: AtLeastOne | None = None,
        gradient_checkpointing: bool = False,
        matryoshka_dims: list[AtLeastOne] | None = None,
        matryoshka_weights: list[Positive] | None = None,
        adaptive_layers: dict | None = None,
    ):
        """`matryoshka_dims` / `matryoshka_weights`: InfoNCE summed over these prefix widths of the representation
        (lightning_modules/matryoshka.py; sentence-transformers' MatryoshkaLoss semantics); null: the plain loss.
        `adaptive_layers`: the objective also at earlier layers, sentence-transformers' AdaptiveLayerLoss settings
        (`Matryoshka2dLoss` with widths), e.g. {n_layers_per_step: 1}; null: the last layer only."""
        super().__init__()
        # The optimiser and schedule are factories (Hydra partials), not weights' metadata: checkpoints keep plain
        # values only (torch.load(weights_only=True)); the run's config records them.
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.optimizer_factory = optimizer or DEFAULT_OPTIMIZER
        self.scheduler_factory = scheduler or DEFAULT_SCHEDULER
        type(self).check_config({"denoise": denoise, "freeze_bias": freeze_bias, "matryoshka_dims": matryoshka_dims,
                                 "matryoshka_weights": matryoshka_weights, "adaptive_layers": adaptive_layers})
        name = type(self).__name__
        if len(templates) != max(1, self.template_views) or not all(isinstance(text, str) for text in templates):
            raise ConfigError(f"{name} trains with {self.template_views} template(s), got {list(templates)!r}")
        self.templates = [Template(text) for text in templates]
        self.eval_template = Template(eval_template or templates[0])
        for template in [*self.templates, self.eval_template] if self.requires_mask else ():
            template.require_mask(type(self).__name__)
        self.tokenizer, model, self.loading_info = load_pretrained(model_name_or_path, mlm_head=load_mlm_head)
        if self.requires_mask and self.tokenizer.mask_token_id is None:
            raise ConfigError(f"model {model_name_or_path!r} has no [MASK] token; prompt-based training needs one")
        # from_pretrained returns eval mode and Lightning keeps each submodule's mode: dropout must be on in training.
        model.train()
        # Keep only the encoder: the *ForMaskedLM wrapper (decoder included) is not a submodule, so checkpoints hold
        # no unused MLM weights and no duplicate keys. Its transform, if trained, is handed to subclasses as tensors.
        self.mlm_transform_state = mlm_transform_state(model, self.loading_info) if load_mlm_head else None
        self.transformer = model.base_model if load_mlm_head else model
        # The [CLS] pooler head (dense + tanh) of BERT-like models is never used: trainable but unused parameters
        # make DDP fail at its second step, so it is frozen (kept, so exports still load without new weights).
        if isinstance(getattr(self.transformer, "pooler", None), torch.nn.Module):
            self.transformer.pooler.requires_grad_(False)
        self.max_length = max_input_length(self.transformer, self.tokenizer, max_length)
        self.matryoshka = self.build_matryoshka(matryoshka_dims, matryoshka_weights)
        self.set_adaptive_layers(adaptive_layers)
        self.builders = [self._builder(t, max_sentence_tokens) for t in self.templates]
        self.input_embedder: torch.nn.Module | None = None
        # Memory options for large batches: gradient caching (lightning_modules/grad_cache.py; the cache of template
        # biases is set only during a cached step) and activation checkpointing inside the transformer.
        if grad_cache_chunk_size is not None and grad_cache_chunk_size < 1:
            raise ConfigError(f"grad_cache_chunk_size must be null or >= 1, got {grad_cache_chunk_size}")
        self.template_bias_cache: TemplateBiasCache | None = None
        # `trainer.compile`: the training forward's compiled form (not a submodule: parameter names and checkpoints
        # stay those of `transformer`, and evaluation keeps calling the eager one) and the sentence-length buckets
        # its inputs are padded to (`compile_training_forward`)
        self.length_buckets: tuple[int, ...] | None = None
        object.__setattr__(self, "training_call", None)
        if gradient_checkpointing:  # non-reentrant: recomputation replays the forward's dropout RNG state
            options = {"use_reentrant": False}
            if hasattr(self.transformer, "activation_checkpointing_enable"):  # transformers >= 5
                self.transformer.activation_checkpointing_enable(options)
            else:
                self.transformer.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)

    def setup(self, stage: str) -> None:
        check_grad_cache_precision(self.trainer.precision, self.hparams.grad_cache_chunk_size)  # before any step

    @classmethod
    def check_compile(cls, settings: dict) -> None:
        """`trainer.compile=true` with this recipe and its `model` settings, checked before anything loads (train.py's
        config check): refused in one line where the compiled step would not be what trains. The encoder recipes
        compile their training forward with every option (gradient caching, activation checkpointing, frozen
        biases, OptiPrompt's soft template: tested)."""

    def compile_training_forward(self) -> None:
        """`trainer.compile=true`: the transformer call of the training step through torch.compile, on inputs padded
        to a few widths (sentence lengths rounded up to a power of two from 8, at most the template's sentence
        limit, the template-bias rows padded to what that width can need), so the step compiles one graph per
        width it meets; evaluation (varying shapes, no gradients) keeps calling the eager transformer."""
        limit = max(builder.max_sentence_tokens for builder in self.builders)
        buckets = [size for size in (8 << k for k in range(12)) if size < limit]
        self.length_buckets = (*buckets, limit)
        object.__setattr__(self, "training_call", torch.compile(self.transformer, dynamic=False))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Lightning records no class; export and `load_module_checkpoint` find the recipe by this name.
        checkpoint[RECORD_KEY] = recipe_record(self)

    # -- what the rest of the framework asks of a recipe (lightning_modules/recipe.py) ----------------------------

    #: Whether checkpoints hold only a LoRA adapter (rebuilt on the recorded base model), so that an export may
    #: merge it into full weights or keep it (`adapter=merge|keep`).
    adapter_only: bool = False

    @classmethod
    def load_checkpoint(cls, path: Path, checkpoint: dict, base_model: str | None = None) -> PromptContrastiveModule:
        """The module of one of this recipe's checkpoints (eval mode, CPU): rebuilt from its hyper-parameters, the
        trained weights loaded strictly; `base_model` replaces a base model that has moved."""
        return rebuild_with_weights(cls, path, checkpoint, base_model)

    @classmethod
    def check_encoding_options(cls, path: Path, hyper_parameters: dict, *, pooler: str | None = None,
                               denoise: bool | None = None, adapter: str | None = None) -> None:
        """The options of an export or `load_encoder` for one of this recipe's checkpoints, refused in one line
        before it loads: `adapter=` is for the LoRA recipes."""
        if adapter is not None:
            raise ConfigError(f"adapter={adapter} applies to checkpoints of the LoRA recipes; {path} is a "
                              f"{cls.__name__} checkpoint with full weights: drop adapter=")

    def encoding_spec(self, pooler: str | None = None, denoise: bool | None = None,
                      adapter: str | None = None) -> EncodingSpec:
        """How this module encodes at inference and what its export records: its primary evaluation pooler (a
        [MASK] pooler with the denoising and head it is scored with, a [CLS] or a mean pooler) on its evaluation
        template, or `pooler="avg"` (the templated mean); `denoise` overrides the [MASK] pooler's denoising. A
        recipe whose primary pooler is none of these overrides this."""
        type(self).check_encoding_options(Path("(this module)"), dict(self.hparams), pooler=pooler, denoise=denoise,
                                          adapter=adapter)
        primary = self.eval_poolers()[0]
        kind = pooler or export_kind(primary)
        if kind is None:
            raise ConfigError(f"{type(self).__name__}'s primary evaluation pooler ({type(primary).__name__}) has no "
                              "export form; export pooler=avg, or override encoding_spec in the recipe")
        mask = kind == "mask" and isinstance(primary, MaskPooler)
        return EncodingSpec(
            transformer=self.transformer, tokenizer=self.tokenizer, template=self.eval_template.text,
            sentence_rule=self.hparams.sentence_rule, pooler=kind, layer=getattr(primary, "layer", -1),
            denoise=(primary.denoise if denoise is None else denoise) if mask else bool(denoise),
            head=getattr(primary, "head", None) if kind in ("mask", "cls") else None,
            head_after_denoise=getattr(primary, "head_after_denoise", False),
            which_mask=getattr(primary, "which_mask", None) if mask else None,
            soft_template=getattr(self, "soft_template", None), max_length=self.max_length)

    # -- representations ------------------------------------------------------------------------------------------

    def _builder(self, template: Template, max_sentence_tokens: int | None) -> InputBuilder:
        form = InputForm(template, self.hparams.sentence_rule, max_sentence_tokens)
        return InputBuilder(self.tokenizer, form, self.max_length)

    def sentence_tokenization(self) -> SentenceTokenization:
        """How training corpora may be pre-tokenized for this module (data/pretokenized.py): batches of the stored ids
        give exactly the inputs the raw sentences would."""
        return SentenceTokenization.for_builders(self.builders)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """Lightning's transfer, keeping the loader's sentence lengths of a pre-tokenized batch in host memory too
        (`host_lengths`): the step plans its shapes from them without reading anything back from the device."""
        host = batch.get("lengths") if isinstance(batch, Mapping) else None
        moved = super().transfer_batch_to_device(batch, device, dataloader_idx)
        if isinstance(host, torch.Tensor) and host.device.type == "cpu":
            moved = {**moved, "host_lengths": host}
        return moved

    def view_batch(self, sentences, builder: InputBuilder) -> Batch:
        """One templated view on the module's device, from raw sentences or from a pre-tokenized batch
        ({"ids": [B, L], "lengths": [B]}, promptemb.data.pretokenized; "host_lengths", the lengths in host memory,
        when the batch came through `transfer_batch_to_device`)."""
        if isinstance(sentences, Mapping):
            return builder.wrap_padded_ids(sentences["ids"].to(self.device), sentences["lengths"].to(self.device),
                                           sentences.get("host_lengths"))
        return collate(builder.build(sentences), self.tokenizer.pad_token_id, self.tokenizer.mask_token_id
                       ).to(self.device)

    def pooled(self, sentences: list[str], builder: InputBuilder, pooler: Pooler) -> torch.Tensor:
        """Pool one templated view of `sentences` (in the module's current train/eval mode, with gradients)."""
        return self.pooled_views(sentences, [builder], pooler)[0]

    def pooled_views(self, sentences: list[str], builders: list[InputBuilder], pooler: Pooler) -> list[torch.Tensor]:
        """One templated view per builder, all views in ONE transformer forward (rows never attend across views and
        dropout is drawn per element, so this is the same computation as a forward per view, at the fixed per-call
        cost of one). When the pooler denoises, the template biases of every view ride in the same forward
        (encoder/folded_forward.py; `freeze_bias`: no gradient through them); under gradient caching they come
        from the step's bias cache instead."""
        needs = pooler.needs
        if needs.attentions or needs.word_embeddings:
            raise ValueError(f"{pooler.name}: the training forward gives hidden states only")
        built: dict[int, Batch] = {}  # OptiPrompt's two dropout views share one builder: tokenize once
        for builder in builders:
            if id(builder) not in built:
                built[id(builder)] = self.view_batch(sentences, builder)
        batches = [built[id(builder)] for builder in builders]
        def forward(layers: tuple[int, ...]):
            merged = concat_batches(batches, self.tokenizer.pad_token_id, width=self.padded_width(batches, builders))
            bias_rows = None
            if needs.template_bias and self.template_bias_cache is None:
                bias_rows = self.plan_template_bias(builders, [self._host_lengths(batch) for batch in batches],
                                                    merged.input_ids.shape[1])
            out = training_forward(self.transformer, merged, layers, bias_rows=bias_rows,
                                   input_embedder=self.input_embedder, freeze_bias=self.hparams.freeze_bias,
                                   call=self.training_call)
            if needs.template_bias and self.template_bias_cache is not None:
                lengths = [self._host_lengths(b) for b in batches]
                biases = self.template_bias_cache.biases(
                    lambda b, n: self.compute_template_biases(b, n, layers), builders, lengths)
                out.template_bias = {layer: torch.cat([bias[layer] for bias in biases]) for layer in biases[0]}
            return out

        out = self.encoder_output(needs.layers, forward)
        return list(pooler(out).split([batch.input_ids.shape[0] for batch in batches]))

    def encoder_output(self, layers: tuple[int, ...], forward: Callable):
        """`forward(layers)`, the `EncoderOutput` of the states a pooler reads (`layers`); while the views of a step
        are computed at several depths (adaptive layers), the depth pass's: one forward, re-pooled at each depth."""
        return forward(layers) if self.depth_pass is None else self.depth_pass.output(layers, forward)

    def plan_template_bias(self, builders: list[InputBuilder], lengths: list[torch.Tensor], width: int) -> BiasRows:
        """The template-denoising rows that ride along in the training forward (encoder/folded_forward.py):
        PromptBERT's template alone, positions after the prefix shifted by n. A recipe that denoises with another
        bias overrides this (and `compute_template_biases`, the same bias under gradient caching)."""
        return plan_bias_rows(builders, lengths, width, position_base(self.transformer), self.tokenizer.pad_token_id,
                              self.device, rows=bias_rows_needed(builders, width) if self.length_buckets else None)

    @staticmethod
    def _host_lengths(batch: Batch) -> torch.Tensor:
        return batch.host_lengths if batch.host_lengths is not None else batch.sentence_lengths.cpu()

    def padded_width(self, batches: list[Batch], builders: list[InputBuilder]) -> int | None:
        """The width the views are padded to when the step is compiled: the template's tokens plus the smallest
        length bucket holding the batch's longest sentence (a few shapes, so a bounded number of graphs); None =
        the widest view's own width."""
        if not self.length_buckets:
            return None
        longest = max(int(self._host_lengths(batch).max()) if batch.input_ids.shape[0] else 0 for batch in batches)
        bucket = next((b for b in self.length_buckets if b >= longest), longest)
        return max(2 + len(b.prefix_ids) + len(b.suffix_ids) + min(bucket, b.max_sentence_tokens) for b in builders)

    def compute_template_biases(self, builders: list[InputBuilder], lengths: list[torch.Tensor],
                                layers: tuple[int, ...] = (-1,)) -> list[dict[int, torch.Tensor]]:
        """Template biases of each view at its rows' sentence lengths, in one forward (`freeze_bias`: no gradient)."""
        with torch.no_grad() if self.hparams.freeze_bias else contextlib.nullcontext():
            return template_biases(self.transformer, builders, lengths, layers, input_embedder=self.input_embedder)

    def contrastive_views(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(anchors, positives, hard negatives or None), each [b, D]."""
        raise NotImplementedError

    def training_views(self, batch) -> Views:
        """What the objective contrasts: `contrastive_views`, or with adaptive layers the views of every depth of
        the step's plan side by side ([b, depths × D]), from one forward per pooled call (`DepthPass`)."""
        if self.adaptive_layers is None:
            return self.contrastive_views(batch)
        self.depth_pass = DepthPass(self.layer_plan.depths)
        try:
            per_depth = []
            for depth in self.depth_pass.depths:
                self.depth_pass.at(depth)
                per_depth.append(self.contrastive_views(batch))
        finally:
            self.depth_pass = None
        return join_depths(per_depth)

    def eval_poolers(self) -> list[Pooler]:
        """Poolers a checkpoint is scored with (at least [MASK] and avg)."""
        raise NotImplementedError

    def evaluation_encoder(self, batch_size: int = BATCH_SIZE) -> Encoder:
        return Encoder.from_model(self.transformer, self.tokenizer, name=self.hparams.model_name_or_path,
                                  batch_size=batch_size, max_length=self.max_length,
                                  input_embedder=self.input_embedder)

    # -- optimisation ---------------------------------------------------------------------------------------------

    def build_matryoshka(self, dims, weights) -> Matryoshka | None:
        """The Matryoshka widths, checked against the representation InfoNCE contrasts (the model's hidden size)."""
        matryoshka = Matryoshka.build(dims, weights)
        if matryoshka is not None:
            matryoshka.check_width(self.transformer.config.hidden_size, type(self).__name__)
        return matryoshka

    def set_adaptive_layers(self, settings: dict | None) -> None:
        """Adaptive layers from their settings, checked against the model's depth, and the seed of their draws:
        taken from Python's generator as the module is built, after the run seeded it, so it is a function of the
        run's seed, the same on every rank and again when a run resumes."""
        dims = self.matryoshka.dims if self.matryoshka is not None else None
        self.adaptive_layers = self.build_adaptive_layers(settings, dims)
        if self.adaptive_layers is not None:
            self.adaptive_layers.check_depth(self.num_layers, type(self).__name__)
            self.layer_seed = random.getrandbits(64)
            self.layer_draws = 0

    @property
    def num_layers(self) -> int:
        return int(self.transformer.config.num_hidden_layers)

    def draw_layers(self) -> LayerPlan:
        """This batch's prior layers and widths (`layer_rng`: keyed by the batch's index in the run, Lightning's
        counter, which a resumed run restores; outside a trainer, the module's own count of draws)."""
        trainer = self._trainer
        index = trainer.fit_loop.total_batch_idx if trainer is not None else self.layer_draws
        self.layer_draws += 1
        widths = len(self.matryoshka.dims) if self.matryoshka is not None else None
        return self.adaptive_layers.draw(layer_rng(self.layer_seed, index), self.num_layers, widths)

    def contrastive_objective(self, anchors: torch.Tensor, positives: torch.Tensor,
                              negatives: torch.Tensor | None) -> torch.Tensor:
        """The objective of the views (`training_views`): InfoNCE, or its Matryoshka sum over prefix widths
        (`layer_objective`); with adaptive layers, that of each depth of the step's plan, weighed, with the KL terms
        (`AdaptiveLayers.loss`)."""
        if self.adaptive_layers is None:
            return self.layer_objective(anchors, positives, negatives, self.matryoshka)
        plan = self.layer_plan

        def objective(views: Views, widths: tuple[int, ...] | None) -> torch.Tensor:
            matryoshka = self.matryoshka if widths is None else self.matryoshka.subset(widths)
            return self.layer_objective(*views, matryoshka)

        return self.adaptive_layers.loss(plan, split_depths((anchors, positives, negatives), len(plan.depths)),
                                         objective, self.full_representation)

    def layer_objective(self, anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None,
                        matryoshka: Matryoshka | None) -> torch.Tensor:
        """InfoNCE of one depth's views, or its sum over these Matryoshka widths."""
        if matryoshka is None:
            return info_nce(anchors, positives, self.hparams.temperature, negatives)
        return matryoshka.loss(anchors, positives, negatives, self.hparams.temperature)

    def full_representation(self, views: torch.Tensor) -> torch.Tensor:
        """The full-width representation within a view (what the KL term of adaptive layers compares)."""
        return views

    def contrastive_loss(self, batch):
        """(InfoNCE of the batch, its rows, what turns the loss to back-propagate into the tensor handed to Lightning):
        the loss itself, or under gradient caching a surrogate carrying the full-batch gradient."""
        if self.adaptive_layers is not None:
            self.layer_plan = self.draw_layers()
        if self.hparams.grad_cache_chunk_size:
            step = GradCache(self, self.hparams.grad_cache_chunk_size)
            return *step.loss(batch), step.surrogate
        anchors, positives, negatives = self.training_views(batch)
        return self.contrastive_objective(anchors, positives, negatives), anchors.shape[0], lambda loss: loss

    def training_step(self, batch, batch_idx):
        loss, rows, to_backward = self.contrastive_loss(batch)
        # The step's one host synchronisation: the loss copied to host memory, where the divergence guard reads it
        # and the progress bar and loggers find it (a device tensor would cost them another one each).
        on_host = loss.detach().to("cpu", torch.float32, copy=True)
        if not torch.isfinite(on_host):
            raise NonFiniteLossError(
                f"loss is {on_host.item()} at step {self.global_step}; stopped before the optimiser step, the saved "
                "checkpoints are from before it; lower optimizer.lr, clip gradients (trainer.gradient_clip_val=1.0) or "
                "train in fp32"
            )
        self.log("train/loss", on_host, prog_bar=True, batch_size=rows)
        # Each rank back-propagates through its own slice of the global similarity matrix; DDP averages gradients,
        # so scaling by the world size gives exactly the single-process gradient of the joined batch.
        return to_backward(loss * self.ddp_gradient_scale())

    def ddp_gradient_scale(self) -> int:
        """The gradient here in units of the mean of the per-rank gradients (what DDP leaves under the reference
        recipes, and what they clipped): the world size, by which `training_step` scales the loss;
        `configure_gradient_clipping` scales its threshold by the same."""
        return world_size()

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """`trainer.gradient_clip_val` clips what the reference recipes (Hugging Face Trainer, `max_grad_norm`)
        clipped: under DDP they clip the mean of the per-rank gradients, the full-batch gradient divided by the
        world size, while the gradient here is the full-batch one itself (`training_step` scales the loss by the
        world size). The threshold is scaled by the world size, so the same steps are clipped by the same factor
        (AdamW does not see the gradient's overall scale); one process: unchanged.

        Without a GradScaler (32-true, bf16-mixed) the gradients are clipped here with torch's own functions, what
        Lightning's 32-bit plugin does; its mixed-precision plugin would refuse fused AdamW even under bf16, where
        there is nothing to unscale. With a GradScaler (16-mixed), Lightning has unscaled them before this hook and
        its plugin clips (the device profile never picks a fused optimiser there)."""
        if not gradient_clip_val:
            return
        algorithm = GradClipAlgorithmType((gradient_clip_algorithm or "norm").lower())
        threshold = gradient_clip_val * self.ddp_gradient_scale()
        plugin = self.trainer.precision_plugin
        if getattr(plugin, "scaler", None) is not None:
            plugin.clip_gradients(optimizer, threshold, algorithm)
            return
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == GradClipAlgorithmType.NORM:
            torch.nn.utils.clip_grad_norm_(params, threshold)
        else:
            torch.nn.utils.clip_grad_value_(params, threshold)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            raise ConfigError(f"{type(self).__name__} has no trainable parameters")
        # fused / foreach AdamW: chosen by the device profile (common/device_profile.py)
        optimizer = self.optimizer_factory(params, **profile_of(self.trainer).optimizer_options(self.optimizer_factory))
        scheduler = self.scheduler_factory(optimizer, max(1, int(self.trainer.estimated_stepping_batches)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
