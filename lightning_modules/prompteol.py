"""PromptEOL supervised: contrastive LoRA fine-tuning of a decoder LLM on NLI triplets (Jiang et al. 2023, "Scaling
Sentence Embeddings with Large Language Models"; kongds/scaling_sentemb ft_llm.py at 8567aa08).

Each sentence of a (premise, entailment, contradiction) triplet fills the PromptEOL template; its embedding is the
last token's state after the final norm (`LastTokenPooler`, the same code evaluate.py scores decoders with). The
loss is InfoNCE with cosine similarity over temperature 0.05 and the contradictions as extra columns (the official
code adds a zero weight to them: plain columns). Only LoRA adapters train (`peft`; official defaults r 64, alpha 16,
dropout 0.05 on q_proj and v_proj); the base model stays frozen, optionally loaded in 4-bit NF4 (QLoRA).

Checkpoints hold only the adapter weights, with the base model's name and a sha256 of its weights as loaded, so an
adapter is never applied to another model. Exports (merged, or the base name plus the adapter) are exporting/'s.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import pytorch_lightning as pl
import torch

from promptemb.common.bounds import AtLeastOne, Fraction, Positive, TokenLimit
from promptemb.common.errors import ConfigError, DataError
from promptemb.common.optional import require
from promptemb.encoder.decoder import (
    DecoderInputBuilder,
    PaddingSide,
    check_last_token_template,
    is_causal_lm,
    run_decoder,
)
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.loading import (
    DTYPES,
    DType,
    check_quantization,
    load_pretrained,
    quantization_kwargs,
    weights_sha256,
)
from promptemb.encoder.model import BATCH_SIZE, Encoder
from promptemb.encoder.pooling import Needs
from promptemb.encoder.template import SentenceRule, Template
from promptemb.lightning_modules.base import DEFAULT_OPTIMIZER, DEFAULT_SCHEDULER, PromptContrastiveModule
from promptemb.lightning_modules.checkpoint import recorded_arguments
from promptemb.lightning_modules.promptbert import PromptBERTSup
from promptemb.lightning_modules.recipe import EncodingSpec, register_recipe
from promptemb.poolers.base import Pooler
from promptemb.poolers.decoder import PROMPTEOL, LastTokenPooler

#: keys of the adapter record in a checkpoint
ADAPTER_RECORD = "promptemb_adapter"
#: `adapter=` of an export or `load_encoder`: fold the adapter into full weights, or keep it as peft files on the base
ADAPTER_MODES = ("merge", "keep")
#: where a kept adapter's peft files go inside an export
ADAPTER_DIR = "adapter"
#: the name the primary evaluation pooler is logged under: the metric checkpoint selection monitors
#: (`val/stsb_dev/mask_best`) for every recipe; here it is the last token of the PromptEOL template
SELECTION_POOLER_NAME = "mask"


def is_adapter_key(key: str) -> bool:
    return "lora_" in key


@register_recipe("prompteol_sup")
class PromptEOLSup(PromptContrastiveModule):
    """LoRA contrastive fine-tuning of a decoder on NLI triplets with the PromptEOL template (see the module
    docstring). Shares InfoNCE, gradient caching, cross-rank negatives and the optimiser with the encoder recipes."""

    def __init__(
        self,
        model_name_or_path: str,
        templates: list[str] = (PROMPTEOL,),
        eval_template: str | None = None,
        temperature: Positive = 0.05,
        optimizer=None,
        scheduler=None,
        max_sentence_tokens: AtLeastOne = 32,
        sentence_rule: SentenceRule = "prompteol",
        max_length: TokenLimit | None = None,
        lora_r: AtLeastOne = 64,
        lora_alpha: AtLeastOne = 16,
        lora_dropout: Fraction = 0.05,
        lora_target_modules: list[str] = ("q_proj", "v_proj"),
        quantization: str | None = None,
        dtype: DType = "float32",
        padding_side: PaddingSide = "left",
        grad_cache_chunk_size: AtLeastOne | None = None,
        gradient_checkpointing: bool = False,
        base_weights_sha256: str | None = None,
        matryoshka_dims: list[AtLeastOne] | None = None,
        matryoshka_weights: list[Positive] | None = None,
        adaptive_layers: dict | None = None,
    ):
        # The encoder recipes' constructor loads a masked LM and requires [MASK]; a decoder is loaded here instead
        # and the attributes the shared training step reads are set the same way. save_hyperparameters() finds
        # arguments only through a chain of super().__init__ calls, which this skips: they are passed explicitly.
        arguments = {k: v for k, v in locals().items() if k not in ("self", "optimizer", "scheduler",
                                                                      "base_weights_sha256", "__class__")}
        pl.LightningModule.__init__(self)
        check_quantization(quantization)  # QLoRA without CUDA / bitsandbytes: one line, before any loading
        peft = require("peft", "LoRA fine-tuning (model=prompteol_sup)")
        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        if lora_r < 1:
            raise ConfigError(f"lora_r must be >= 1, got {lora_r}")
        if grad_cache_chunk_size is not None and grad_cache_chunk_size < 1:
            raise ConfigError(f"grad_cache_chunk_size must be null or >= 1, got {grad_cache_chunk_size}")
        type(self).check_config({"matryoshka_dims": matryoshka_dims, "matryoshka_weights": matryoshka_weights,
                                 "adaptive_layers": adaptive_layers})
        templates = list(templates)
        if len(templates) != 1 or not isinstance(templates[0], str):
            raise ConfigError(f"PromptEOLSup trains with 1 template, got {templates!r}")
        arguments.update(templates=templates, lora_target_modules=list(lora_target_modules))
        self.save_hyperparameters(arguments)
        self.optimizer_factory = optimizer or DEFAULT_OPTIMIZER
        self.scheduler_factory = scheduler or DEFAULT_SCHEDULER
        self.templates = [Template(templates[0])]
        self.eval_template = Template(eval_template or templates[0])
        for template in [*self.templates, self.eval_template]:
            check_last_token_template(type(self).__name__, template)
        model_kwargs = {"dtype": DTYPES[dtype], **quantization_kwargs(quantization)}
        self.tokenizer, model, self.loading_info = load_pretrained(model_name_or_path, **model_kwargs)
        if not is_causal_lm(model.config):
            raise ConfigError(f"PromptEOLSup fine-tunes a decoder (causal LM); model {model_name_or_path!r} is "
                              f"{type(model).__name__}, an encoder: use promptbert_sup for encoders")
        self.base_weights_sha256 = weights_sha256(model)
        if base_weights_sha256 is not None and base_weights_sha256 != self.base_weights_sha256:
            raise DataError(f"the adapter was trained on base weights sha256 {base_weights_sha256[:12]}…, but "
                            f"{model_name_or_path!r} has {self.base_weights_sha256[:12]}…; pass base_model= the "
                            "model it was trained from")
        self.transformer = self._with_adapter(peft, model, quantization, gradient_checkpointing)
        # sentences are cut to max_sentence_tokens anyway; 512 bounds template + sentence whatever the tokenizer's
        # model_max_length says (often unset: 1e30)
        self.max_length = max_length or min(int(getattr(self.tokenizer, "model_max_length", 512) or 512), 512)
        self.builders = [DecoderInputBuilder(self.tokenizer, InputForm(self.templates[0], sentence_rule,
                                                                       max_sentence_tokens),
                                             self.max_length, padding_side)]
        self.pooler = LastTokenPooler(SELECTION_POOLER_NAME, layer=-1)
        self.matryoshka = self.build_matryoshka(matryoshka_dims, matryoshka_weights)
        self.set_adaptive_layers(adaptive_layers)
        self.input_embedder = None
        self.template_bias_cache = None

    def _with_adapter(self, peft, model: torch.nn.Module, quantization: str | None, gradient_checkpointing: bool):
        hp = self.hparams
        if quantization is not None:  # what the official QLoRA path does before adding adapters
            model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
        elif gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        config = peft.LoraConfig(r=hp.lora_r, lora_alpha=hp.lora_alpha, lora_dropout=hp.lora_dropout, bias="none",
                            target_modules=list(hp.lora_target_modules))
        try:
            wrapped = peft.get_peft_model(model, config)
        except ValueError as err:  # target modules the model does not have
            raise ConfigError(f"LoRA cannot wrap {type(model).__name__}: {str(err).splitlines()[0][:200]}; set "
                              "model.lora_target_modules to its attention projections") from None
        wrapped.train()  # from_pretrained returns eval mode: LoRA dropout must be on in training
        return wrapped

    @classmethod
    def check_compile(cls, settings: dict) -> None:
        raise ConfigError("trainer.compile=true compiles the training forward of the encoder recipes; PromptEOLSup "
                          "(a decoder with LoRA adapters) trains eager: drop trainer.compile")

    def compile_training_forward(self) -> None:
        type(self).check_compile({})

    # -- representations ------------------------------------------------------------------------------------------

    def sentence_tokenization(self):
        """Decoder inputs are built from raw strings (the template is tokenized with the sentence as one string),
        so the training corpus is not pre-tokenized."""
        return None

    def pooled(self, sentences, builder: DecoderInputBuilder, pooler: Pooler) -> torch.Tensor:
        if isinstance(sentences, Mapping):
            raise ConfigError("PromptEOLSup reads raw sentences; set data.pretokenize=false")

        def forward(layers: tuple[int, ...]):
            batch = builder.collate(builder.build(list(sentences))).to(self.device)
            return run_decoder(self.transformer, batch, Needs(layers=layers), builder.form)

        return pooler(self.encoder_output((pooler.layer,), forward))

    # NLI triplets -> (anchors, positives, contradictions), as PromptBERT's supervised recipe reads them
    contrastive_views = PromptBERTSup.contrastive_views

    def eval_poolers(self) -> list[Pooler]:
        return [self.pooler]

    def evaluation_encoder(self, batch_size: int = BATCH_SIZE) -> Encoder:
        return Encoder.from_model(self.transformer, self.tokenizer, name=self.hparams.model_name_or_path,
                                  batch_size=batch_size, max_length=self.max_length,
                                  padding_side=self.hparams.padding_side)

    def embed(self, sentences: list[str]) -> torch.Tensor:
        """[N, D] evaluation embeddings (eval mode, no gradient) of raw sentences with the evaluation template, as the
        STS callback, evaluate.py and an export encode them: whole sentences (`max_sentence_tokens` cuts training
        batches only)."""
        builder = DecoderInputBuilder(self.tokenizer, InputForm(self.eval_template, self.hparams.sentence_rule, None),
                                      self.max_length, self.hparams.padding_side)
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self.pooled(sentences, builder, self.pooler)
        finally:
            self.train(was_training)

    # -- checkpoints: the adapter only ----------------------------------------------------------------------------

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Checkpoints hold only the adapter (the frozen base comes from the base model itself), so a state dict is
        complete when it has every adapter weight; `strict` refuses a missing adapter weight or an unknown key. (A
        full state dict, as the fit-end scoring restores, loads too.)"""
        if strict:
            own = self.state_dict()
            missing = sorted(key for key in own if is_adapter_key(key) and key not in state_dict)
            unexpected = sorted(key for key in state_dict if key not in own)
            if missing or unexpected:
                raise RuntimeError(f"adapter state of {type(self).__name__} does not fit: {len(missing)} missing "
                                   f"(e.g. {missing[:1]}), {len(unexpected)} unknown weights (e.g. {unexpected[:1]})")
        return super().load_state_dict(state_dict, strict=False, assign=assign)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if is_adapter_key(k)}
        checkpoint[ADAPTER_RECORD] = {"base_model": self.hparams.model_name_or_path,
                                      "base_weights_sha256": self.base_weights_sha256}


    # -- what the framework asks of the recipe: an adapter on its recorded base --------------------------------

    adapter_only = True
    #: the one pooler its checkpoints encode with, and what it is
    own_pooler = ("last_token", "the template's last token")

    @classmethod
    def load_checkpoint(cls, path: Path, checkpoint: dict, base_model: str | None = None) -> PromptEOLSup:
        """Its base model (recorded name, or `base_model`) with the trained adapter, in eval mode; a base whose
        weights differ from the recorded hash is refused in one line."""
        record, hparams = adapter_record(path, checkpoint, base_model)
        return restore_adapter_module(cls, path, checkpoint, record, hparams)

    @classmethod
    def check_encoding_options(cls, path: Path, hyper_parameters: dict, *, pooler: str | None = None,
                               denoise: bool | None = None, adapter: str | None = None) -> None:
        """A decoder checkpoint encodes with its own pooler, without denoising; `adapter` is merge or keep."""
        own, what = cls.own_pooler
        if pooler not in (None, own):
            raise ConfigError(f"{path} is a decoder checkpoint: it exports pooler={own} ({what}); drop pooler=")
        if denoise is not None:
            raise ConfigError(f"{path} is a decoder checkpoint: template denoising is defined for [MASK] templates "
                              "only; drop denoise=")
        if adapter is not None and adapter not in ADAPTER_MODES:
            raise ConfigError(f"unknown adapter={adapter}; valid: {', '.join(ADAPTER_MODES)}")

    def encoding_spec(self, pooler: str | None = None, denoise: bool | None = None,
                      adapter: str | None = None) -> EncodingSpec:
        """The evaluation template's last token. `adapter="merge"`: the adapter folded into a copy of the base
        weights (the module stays unmerged); "keep" or None: the peft model itself, recorded with the base model's
        name and weights sha256."""
        type(self).check_encoding_options(Path("(this module)"), dict(self.hparams), pooler=pooler, denoise=denoise,
                                          adapter=adapter)
        hparams = self.hparams
        quantization = hparams.get("quantization")
        if adapter == "merge":
            if quantization is not None:
                raise ConfigError("a 4-bit (QLoRA) base cannot be merged exactly; export with adapter=keep")
            transformer, kept = merged_copy(self).eval(), None
        else:
            transformer = self.transformer
            kept = {"base_model": hparams.model_name_or_path, "base_weights_sha256": self.base_weights_sha256,
                    "dir": ADAPTER_DIR, "dtype": hparams.dtype, "quantization": quantization}
        template = None if self.eval_template is None else self.eval_template.text  # LLM2Vec's recipes: none
        return EncodingSpec(transformer=transformer, tokenizer=self.tokenizer, template=template,
                            sentence_rule=hparams.sentence_rule, pooler=self.own_pooler[0], layer=self.pooler.layer,
                            max_length=self.max_length, padding_side=hparams.padding_side, adapter=kept,
                            source={"adapter_export": adapter or "keep"})


def adapter_state(module: PromptEOLSup) -> dict[str, torch.Tensor]:
    return {k: v for k, v in module.state_dict().items() if is_adapter_key(k)}


def adapter_record(path: str | Path, checkpoint: dict, base_model: str | None) -> tuple[dict, dict]:
    """(adapter record, constructor arguments with `base_model` in place of the recorded name) of a LoRA recipe's
    checkpoint; one line when it holds no adapter record."""
    record = checkpoint.get(ADAPTER_RECORD)
    if not isinstance(record, dict) or "base_weights_sha256" not in record:
        raise DataError(f"checkpoint {path} holds no LoRA adapter record; it was not written by a LoRA recipe")
    return record, recorded_arguments(checkpoint, base_model)


def restore_adapter_module(module_class, path: str | Path, checkpoint: dict, record: dict, arguments: dict):
    """`module_class` rebuilt on its base (refused in one line when the base's weights differ from the recorded
    hash) with the checkpoint's adapter, in eval mode."""
    module = module_class(**{**arguments, "base_weights_sha256": record["base_weights_sha256"]})
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as err:
        raise DataError(f"checkpoint {path}: {str(err).splitlines()[0]}") from None
    module.eval()
    return module


def merged_copy(module: PromptEOLSup) -> torch.nn.Module:
    """The base model with the adapter folded in, leaving `module` itself unmerged (merging mutates the weights)."""
    return copy.deepcopy(module.transformer).merge_and_unload()
