"""LLM2Vec (BehnamGhader et al., COLM 2024; McGill-NLP/llm2vec 0.2.3 = 312adcf): a decoder turned into an encoder
in three steps, each a LoRA recipe on the bidirectional model (`encoder/bidirectional.py`).

* `LLM2VecMNTP` — masked next-token prediction (experiments/run_mntp.py): a fraction p of the non-special tokens is
  chosen (default collator: 80% of them become the mask token, 10% a random token, 10% stay; `all_mask`: all become
  the mask token), and the token at position i is predicted from the output at position i−1:
  L = −(1/|M|) Σ_{i∈M} log softmax(W h_{i−1})[x_i] (the causal-LM head and its shifted loss on the bidirectional
  model). Mask token `_` when the tokenizer has none (`mask_token_type` blank). Official configs: LLaMA-2/3 and
  Sheared-LLaMA p 0.2 with the default collator, Mistral p 0.8 with `all_mask`; LoRA r 16, alpha 2r, dropout 0.05 on
  q, k, v, o, gate, up, down of the base model (the LM head stays frozen); 512-token blocks, batch 32, 1000 steps.
* `LLM2VecContrastive` — SimCSE (experiments/run_simcse.py: each sentence twice through attention dropout 0.3,
  InfoNCE over cosine × 20, i.e. τ = 0.05) or the supervised stage (run_supervised.py: (query, positive, hard
  negative) with the negatives as extra columns), both on the bidirectional model with the MNTP adapter merged into
  the base first (`mntp_adapter`), a new LoRA (r 16, alpha 32, dropout 0.05, the same seven projections); embeddings
  are evaluated with the LLM2Vec pooler (`poolers/llm2vec.py`, mean by default, = `LLM2Vec.encode`).

  The training views (`train_pooling`): `official` pools them as the official trainers do. Their collators
  tokenize with `LLM2Vec.tokenize`, whose `embed_mask` marks the text after the separator `!@#$%^&*()`, and
  `LLM2Vec.forward` pools with `get_pooling` (`official_pool`), which reads that mask as the row's length. SimCSE's
  Wiki1M sentences carry no separator and run_simcse.py calls no `prepare_for_tokenization`: the row is `<s> x`
  (no end text, no instruction: `model.instruction` is then the evaluation's only), left-padded with EOS, and its
  `embed_mask` is all zero — mean averages all T positions (padding and `<s>` included, so the padded width of the
  device batch matters), weighted_mean is a zero vector (loss log N, no gradient), eos_token / last_token the last
  position, bos_token `<s>`. run_supervised.py's E5 texts carry the separator and its collator calls
  `prepare_for_tokenization`: rows as `encode` writes them (the eos_token end text, `<s>` and the instruction not
  pooled), with the task instruction on queries only, joined as `instruction + "; " + query`. Both pad on the left
  with EOS whatever `model.padding_side` (the evaluation's). The official forward passes no position ids, so it
  numbers the padding: SimCSE's rows are numbered so (its mean pools the padding's states); the supervised rows,
  whose padding is never pooled, count real tokens only (the same states up to rounding). `evaluation` pools the
  training views with the evaluation pooler instead (the instruction on every sentence).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from promptemb.common.bounds import AtLeastOne, Fraction, Positive, TokenLimit
from promptemb.common.errors import ConfigError, DataError
from promptemb.common.optional import require
from promptemb.data.checksums import sha256_file
from promptemb.encoder.bidirectional import check_bidirectional_family
from promptemb.encoder.decoder import DecoderInputBuilder, PaddingSide, is_causal_lm, run_decoder
from promptemb.encoder.decoder_forms import DecoderForm, LLM2VecInput
from promptemb.encoder.inputs import PAD, POOLED, Batch, InputForm, TokenizedInput
from promptemb.encoder.loading import DTYPES, DType, check_model_source
from promptemb.encoder.pooling import Needs
from promptemb.encoder.template import SentenceRule
from promptemb.lightning_modules.checkpoint import read_checkpoint
from promptemb.lightning_modules.prompteol import (
    ADAPTER_RECORD,
    SELECTION_POOLER_NAME,
    PromptEOLSup,
    adapter_record,
    is_adapter_key,
    restore_adapter_module,
    weights_sha256,
)
from promptemb.lightning_modules.recipe import EncodingSpec, register_recipe
from promptemb.poolers.llm2vec import POOLING_MODES, LLM2VecPooler, official_pool

log = logging.getLogger(__name__)

#: run_mntp.py / run_simcse.py `initialize_peft`: every projection of LLaMA, Mistral, Gemma and Qwen2 blocks
ALL_PROJECTIONS = ("q_proj", "v_proj", "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COLLATORS = ("default", "all_mask")
MASK_TOKEN_TYPES = ("blank", "eos")
#: `train_pooling`: `official` as run_simcse.py / run_supervised.py pool the training views (see the module
#: docstring); `evaluation` with the pooler the model is evaluated with (`LLM2Vec.encode`)
TRAIN_POOLINGS = ("official", "evaluation")


def check_llm2vec_model(recipe: str, model_name_or_path: str, revision: str | None = None) -> None:
    """Before any weight loads: the model must be a decoder of a family with a bidirectional forward."""
    from transformers import AutoConfig

    path = check_model_source(model_name_or_path)
    try:
        config = AutoConfig.from_pretrained(path, revision=revision)
    except (OSError, ValueError):
        return  # left to the loading, which reports it in one line
    if not is_causal_lm(config):
        raise ConfigError(f"{recipe} trains a decoder (causal LM) with bidirectional attention; model "
                          f"{model_name_or_path!r} is {getattr(config, 'model_type', type(config).__name__)!r}, an "
                          "encoder: MNTP and LLM2Vec's contrastive stages are for decoders (use promptbert_* for "
                          "encoders)")
    check_bidirectional_family(recipe, config)


@register_recipe("llm2vec_contrastive")
class LLM2VecContrastive(PromptEOLSup):
    """LLM2Vec's SimCSE (`views=dropout`: each sentence twice, attention dropout) or supervised stage
    (`views=triplets`) with LoRA on the bidirectional model; training views pooled as the official trainers pool them
    (`train_pooling=official`) or as evaluated (`evaluation`), embeddings evaluated as `poolers/llm2vec.py`."""

    RECIPE = "LLM2VecContrastive"
    #: no template: the plain sentence in LLM2Vec's input format (train.py's template check: template=none)
    template_views = 0

    def __init__(
        self,
        model_name_or_path: str,
        views: str = "dropout",
        pooling_mode: str = "mean",
        train_pooling: str = "official",
        instruction: str = "",
        temperature: Positive = 0.05,
        optimizer=None,
        scheduler=None,
        max_sentence_tokens: AtLeastOne = 128,
        max_length: TokenLimit | None = None,
        sentence_rule: SentenceRule = "none",
        lora_r: AtLeastOne = 16,
        lora_alpha: AtLeastOne = 32,
        lora_dropout: Fraction = 0.05,
        lora_target_modules: list[str] = ALL_PROJECTIONS,
        attention_dropout: Fraction = 0.3,
        mntp_adapter: str | None = None,
        dtype: DType = "float32",
        padding_side: PaddingSide = "left",
        grad_cache_chunk_size: AtLeastOne | None = None,
        gradient_checkpointing: bool = False,
        base_weights_sha256: str | None = None,
    ):
        arguments = {k: v for k, v in locals().items() if k not in ("self", "optimizer", "scheduler",
                                                                      "base_weights_sha256", "__class__")}
        arguments["lora_target_modules"] = list(lora_target_modules)
        if views not in ("dropout", "triplets"):
            raise ConfigError(f"unknown views {views!r}; valid: dropout (SimCSE), triplets (supervised)")
        if pooling_mode not in POOLING_MODES:
            raise ConfigError(f"{self.RECIPE}: LLM2Vec has no pooling mode {pooling_mode!r}; valid: "
                              f"{', '.join(POOLING_MODES)}")
        if train_pooling not in TRAIN_POOLINGS:
            raise ConfigError(f"unknown train_pooling {train_pooling!r}; valid: official (as run_simcse.py / "
                              "run_supervised.py pool the training views), evaluation (as the model is evaluated)")
        if train_pooling == "official" and views == "dropout" and pooling_mode == "weighted_mean":
            log.warning("train_pooling=official, views=dropout, pooling_mode=weighted_mean: run_simcse.py's "
                        "weighted mean is a zero vector (its embed_mask is empty), the loss stays log N and nothing "
                        "trains; train_pooling=evaluation trains the weighted mean over the sentence")
        self._setup(arguments, optimizer, scheduler, base_weights_sha256)
        self.view_width: int | None = None  # official SimCSE under gradient caching: the device batch's width
        self.official_builders = self._official_builders() if train_pooling == "official" else None

    # -- building (shared with MNTP) --------------------------------------------------------------------------

    def _setup(self, arguments: dict, optimizer, scheduler, base_weights_sha256: str | None) -> None:
        import pytorch_lightning as pl

        from promptemb.lightning_modules.base import DEFAULT_OPTIMIZER, DEFAULT_SCHEDULER

        pl.LightningModule.__init__(self)
        peft = require("peft", f"LoRA fine-tuning ({self.RECIPE})")
        name = arguments["model_name_or_path"]
        if arguments["dtype"] not in DTYPES:
            raise ConfigError(f"unknown dtype {arguments['dtype']!r}; valid: {', '.join(DTYPES)}")
        check_llm2vec_model(self.RECIPE, name)  # an encoder or another family: one line before any weight loads
        if arguments.get("mntp_adapter"):  # recorded absolute: the checkpoint reloads from any working directory
            arguments["mntp_adapter"] = str(Path(arguments["mntp_adapter"]).resolve())
        self.save_hyperparameters(arguments)
        self.optimizer_factory = optimizer or DEFAULT_OPTIMIZER
        self.scheduler_factory = scheduler or DEFAULT_SCHEDULER
        model = self._load(name, DTYPES[arguments["dtype"]])
        self.base_weights_sha256 = weights_sha256(model)
        if base_weights_sha256 is not None and base_weights_sha256 != self.base_weights_sha256:
            raise DataError(f"the adapter was trained on base weights sha256 {base_weights_sha256[:12]}…, but "
                            f"{name!r} has {self.base_weights_sha256[:12]}…; pass base_model= the model it was "
                            "trained from")
        self.mntp_adapter_sha256 = None
        if arguments.get("mntp_adapter"):
            model = merge_mntp_adapter(peft, model, arguments["mntp_adapter"], self.base_weights_sha256)
            self.mntp_adapter_sha256 = sha256_file(Path(arguments["mntp_adapter"]), cached=False)
        self.transformer = self._with_adapter(peft, model, None, arguments.get("gradient_checkpointing", False))
        self.max_length = arguments["max_length"] or min(int(getattr(self.tokenizer, "model_max_length", 512)
                                                             or 512), 512)
        self.pooler = LLM2VecPooler(SELECTION_POOLER_NAME, pooling_mode=arguments.get("pooling_mode", "mean"),
                                    instruction=arguments.get("instruction", ""))
        self.pooler.check_model(self.transformer.config)
        self.pooler.bind_encoder(_Bound(self.transformer.config, self.tokenizer))  # eos_token's end text
        form = self.pooler.input_form()
        self.eval_template = None
        self.templates = []
        self.builders = [DecoderInputBuilder(self.tokenizer, form.__class__(None, "none",
                                                                              arguments["max_sentence_tokens"],
                                                                              form.decoder),
                                             self.max_length, arguments["padding_side"])]
        self.matryoshka = None
        self.input_embedder = None
        self.template_bias_cache = None

    def _load(self, name: str, dtype: torch.dtype) -> torch.nn.Module:
        """The base model (no LM head), attention dropout set for SimCSE."""
        from transformers import AutoModel, AutoTokenizer

        path = check_model_source(name)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        extra = {"attention_dropout": self.hparams.attention_dropout} if "attention_dropout" in self.hparams else {}
        return AutoModel.from_pretrained(path, dtype=dtype, **extra)

    # -- representations -------------------------------------------------------------------------------------

    def pooled(self, sentences, builder: DecoderInputBuilder, pooler) -> torch.Tensor:
        if isinstance(sentences, Mapping):
            raise ConfigError(f"{self.RECIPE} reads raw sentences; set data.pretokenize=false")
        batch = builder.collate(builder.build(list(sentences))).to(self.device)
        out = run_decoder(self.transformer, batch, Needs(layers=(pooler.layer,)), builder.form)
        return pooler(out)

    def contrastive_views(self, batch):
        if self.official_builders is not None:
            return self.official_views(batch)
        if self.hparams.views == "triplets":
            return PromptEOLSup.contrastive_views(self, batch)
        sentences = list(batch)
        pooled = self.pooled(sentences + sentences, self.builders[0], self.pooler)  # two dropout draws
        return pooled[: len(sentences)], pooled[len(sentences):], None

    # -- the training views as the official trainers pool them (train_pooling=official) ----------------------------

    def _official_builders(self) -> dict[str, DecoderInputBuilder]:
        """The rows of run_simcse.py's collator (`simcse`: the sentence alone, no end text) and run_supervised.py's
        (`query`: E5's `instruction; query`, `document`: the text alone; the eos_token end text on both)."""
        if self.tokenizer.eos_token_id is None:
            raise ConfigError(f"train_pooling=official pads with the EOS token, as the official trainers; "
                              f"{self.hparams.model_name_or_path!r} has none: use train_pooling=evaluation")
        suffix = self.pooler.decoder.llm2vec.suffix
        instruction = self.hparams.instruction.strip()
        inputs = {"simcse": LLM2VecInput(), "document": LLM2VecInput("", suffix),
                  "query": LLM2VecInput(f"{instruction};" if instruction else "", suffix)}
        return {name: DecoderInputBuilder(self.tokenizer, InputForm(None, "none", self.hparams.max_sentence_tokens,
                                                                    DecoderForm(llm2vec=form, bidirectional=True)),
                                          self.max_length, "left")
                for name, form in inputs.items()}

    def official_views(self, batch):
        """(anchors, positives, negatives or None) pooled by `official_pool`; the triplets' rows in one forward
        (padding is never pooled there), SimCSE's two views as one forward of the batch written twice."""
        if isinstance(batch, Mapping):
            raise ConfigError(f"{self.RECIPE} reads raw sentences; set data.pretokenize=false")
        builders = self.official_builders
        if self.hparams.views == "dropout":
            items = builders["simcse"].build(list(batch))
            pooled = self.official_pooled(items + items, self.view_width, simcse=True)  # two dropout draws
            return pooled[: len(items)], pooled[len(items):], None
        items = [item for query, positive, negative in batch
                 for item in (builders["query"].build([query])[0], *builders["document"].build([positive, negative]))]
        pooled = self.official_pooled(items, None, simcse=False)
        pooled = pooled.view(pooled.shape[0] // 3, 3, -1)
        return pooled[:, 0], pooled[:, 1], pooled[:, 2]

    def official_pooled(self, items: list[TokenizedInput], width: int | None, simcse: bool) -> torch.Tensor:
        """`LLM2Vec.forward` on the official rows: left-padded with EOS to `width` (None: the widest row); SimCSE:
        position ids 0..T-1 over the padding, whose states its mean pools, and `embed_mask` all zero; supervised: the
        pooled span, positions from the mask (the official numbering gives the same states up to rounding, and this
        one keeps a row's embedding independent of the batch it is padded in)."""
        batch = official_rows(items, self.tokenizer.eos_token_id, width, count_padding=simcse).to(self.device)
        form = self.official_builders["simcse"].form
        out = run_decoder(self.transformer, batch, Needs(layers=(-1,)), form)
        embed_mask = torch.zeros_like(batch.attention_mask) if simcse else (batch.roles == POOLED).long()
        return official_pool(out.layer(-1), embed_mask, batch.input_ids, batch.attention_mask,
                             self.hparams.pooling_mode, self.pooler.bos_id)

    def contrastive_loss(self, batch):
        """Official SimCSE under gradient caching: every chunk is padded to the width of the whole device batch, the
        width the official collator pads its views to (mean pools that padding)."""
        if self.official_builders is None or self.hparams.views != "dropout" or not self.hparams.grad_cache_chunk_size:
            return super().contrastive_loss(batch)
        if isinstance(batch, Mapping):
            raise ConfigError(f"{self.RECIPE} reads raw sentences; set data.pretokenize=false")
        self.view_width = max(len(item.input_ids) for item in self.official_builders["simcse"].build(list(batch)))
        loss, rows, to_backward = super().contrastive_loss(batch)

        def backward(value):
            try:
                return to_backward(value)
            finally:
                self.view_width = None

        return loss, rows, backward

    def embed(self, sentences: list[str]) -> torch.Tensor:
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self.pooled(sentences, self.builders[0], self.pooler)
        finally:
            self.train(was_training)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)  # the adapter only, with the base model's name and weights sha256
        checkpoint[ADAPTER_RECORD]["mntp_adapter_sha256"] = self.mntp_adapter_sha256

    # -- what the framework asks of the recipe ----------------------------------------------------------------

    own_pooler = ("llm2vec", "its LLM2Vec pooling")

    @classmethod
    def load_checkpoint(cls, path: Path, checkpoint: dict, base_model: str | None = None) -> LLM2VecContrastive:
        """Its base model (recorded name, or `base_model`), the MNTP adapter it was trained on merged in (the very
        file: its sha256 is recorded), and the trained adapter, in eval mode. A base or MNTP adapter other than the
        recorded one is refused in one line."""
        record, hparams = adapter_record(path, checkpoint, base_model)
        mntp = hparams.get("mntp_adapter")
        if mntp:
            if not Path(mntp).is_file():
                raise DataError(f"checkpoint {path} was trained on the MNTP adapter {mntp}, which no longer exists; "
                                "put that checkpoint back where it was")
            if sha256_file(Path(mntp), cached=False) != record.get("mntp_adapter_sha256"):
                raise DataError(f"checkpoint {path} was trained on another MNTP adapter than the one now at {mntp} "
                                "(sha256 differs from the recorded one); put the original checkpoint back there")
        return restore_adapter_module(cls, path, checkpoint, record, hparams)

    @classmethod
    def check_encoding_options(cls, path: Path, hyper_parameters: dict, *, pooler: str | None = None,
                               denoise: bool | None = None, adapter: str | None = None) -> None:
        """A contrastive adapter sits on the base with the MNTP adapter merged in, which no kept adapter can name:
        merge only."""
        super().check_encoding_options(path, hyper_parameters, pooler=pooler, denoise=denoise, adapter=adapter)
        if adapter == "keep" and hyper_parameters.get("mntp_adapter"):
            raise ConfigError(f"adapter=keep: {path} was trained on an MNTP adapter merged into its base, which a "
                              "kept adapter cannot name; export with adapter=merge (full weights)")

    def encoding_spec(self, pooler: str | None = None, denoise: bool | None = None,
                      adapter: str | None = None) -> EncodingSpec:
        """LLM2Vec's pooling of the bidirectional model on the plain sentence in its input format (no template)."""
        spec = super().encoding_spec(pooler, denoise, adapter)
        spec.template, spec.pooler, spec.llm2vec = None, self.own_pooler[0], self.pooler.settings()
        return spec


def official_rows(items: list[TokenizedInput], pad_id: int, width: int | None = None,
                  count_padding: bool = True) -> Batch:
    """The official trainers' batch (`LLM2Vec.from_pretrained`: pad = EOS, padding on the left), at least `width`
    wide. `count_padding`: positions 0..T-1 in every row, as the official forward numbers them (it passes no position
    ids); else counted over real tokens only."""
    width = max(width or 0, *(len(item.input_ids) for item in items))
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    roles = torch.full((len(items), width), PAD, dtype=torch.long)
    for row, item in enumerate(items):
        ids[row, width - len(item.input_ids):] = torch.tensor(item.input_ids)
        roles[row, width - len(item.roles):] = torch.tensor(item.roles)
    attention_mask = (roles != PAD).long()
    positions = torch.arange(width).repeat(len(items), 1) if count_padding else (attention_mask.cumsum(1) - 1).clamp(0)
    return Batch(input_ids=ids, attention_mask=attention_mask, roles=roles,
                 mask_token=torch.zeros_like(roles, dtype=torch.bool),
                 sentence_lengths=torch.tensor([item.sentence_length for item in items], dtype=torch.long),
                 position_ids=positions)


class _Bound:
    """What `LLM2VecPooler.bind_encoder` reads from an encoder: the model's config and the tokenizer."""

    def __init__(self, config, tokenizer):
        self.transformer = type("Model", (), {"config": config})()
        self.tokenizer = tokenizer


def merge_mntp_adapter(peft, model: torch.nn.Module, path: str, base_sha256: str) -> torch.nn.Module:
    """The base model with an `LLM2VecMNTP` checkpoint's adapter folded in (run_simcse.py: `merge_peft=True`)."""
    checkpoint = read_checkpoint(path)
    record = checkpoint.get("promptemb_adapter")
    if not isinstance(record, dict) or checkpoint.get("hyper_parameters", {}).get("mlm_probability") is None:
        raise DataError(f"mntp_adapter {path} is not a checkpoint of LLM2VecMNTP (experiment=llm2vec_mntp)")
    if record.get("base_weights_sha256") != base_sha256:
        raise DataError(f"mntp_adapter {path} was trained on other base weights than this model's")
    hp = checkpoint["hyper_parameters"]
    config = peft.LoraConfig(r=hp["lora_r"], lora_alpha=hp["lora_alpha"], lora_dropout=0.0, bias="none",
                             target_modules=list(hp["lora_target_modules"]))
    wrapped = peft.get_peft_model(model, config)
    state = {key.removeprefix("transformer."): value for key, value in checkpoint["state_dict"].items()}
    missing = [key for key in wrapped.state_dict() if is_adapter_key(key) and key not in state]
    if missing:
        raise DataError(f"mntp_adapter {path} lacks adapter weights (e.g. {missing[0]})")
    wrapped.load_state_dict(state, strict=False)
    return wrapped.merge_and_unload()


def mntp_mask(input_ids: torch.Tensor, special: torch.Tensor, probability: float, mask_id: int, vocab_size: int,
              collator: str = "default", generator: torch.Generator | None = None):
    """(inputs, labels) as transformers' `DataCollatorForLanguageModeling.torch_mask_tokens` (default) or
    run_mntp.py's `DataCollatorForLanguageModelingWithFullMasking` (all_mask) draw them, in the same order from the
    same RNG: chosen ~ Bernoulli(p) off special tokens; 80% of the chosen -> mask, half the rest -> a random id in
    [0, len(tokenizer)), the rest kept. Labels are -100 off the chosen tokens."""
    labels = input_ids.clone()
    inputs = input_ids.clone()
    matrix = torch.full(labels.shape, probability).masked_fill_(special.bool(), 0.0)
    chosen = torch.bernoulli(matrix, generator=generator).bool()
    labels[~chosen] = -100
    if collator == "all_mask":
        inputs[chosen] = mask_id
        return inputs, labels
    replaced = torch.bernoulli(torch.full(labels.shape, 0.8), generator=generator).bool() & chosen
    inputs[replaced] = mask_id
    randomised = torch.bernoulli(torch.full(labels.shape, 0.5), generator=generator).bool() & chosen & ~replaced
    random_ids = torch.randint(vocab_size, labels.shape, dtype=torch.long, generator=generator)
    inputs[randomised] = random_ids[randomised]
    return inputs, labels


def mntp_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Masked next-token prediction: the label at i scored by the logits at i−1 (the causal LM's shifted loss),
    mean over the chosen tokens, in float32."""
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


@register_recipe("llm2vec_mntp")
class LLM2VecMNTP(LLM2VecContrastive):
    """LLM2Vec's masked next-token prediction with LoRA on the bidirectional decoder (see the module docstring);
    evaluated during training with LLM2Vec's mean pooling (what MNTP is meant to make usable)."""

    RECIPE = "LLM2VecMNTP"

    def __init__(
        self,
        model_name_or_path: str,
        mlm_probability: Fraction = 0.2,
        data_collator: str = "default",
        mask_token_type: str = "blank",
        pooling_mode: str = "mean",
        optimizer=None,
        scheduler=None,
        max_sentence_tokens: AtLeastOne = 512,
        max_length: TokenLimit | None = None,
        sentence_rule: SentenceRule = "none",
        lora_r: AtLeastOne = 16,
        lora_alpha: AtLeastOne = 32,
        lora_dropout: Fraction = 0.05,
        lora_target_modules: list[str] = ALL_PROJECTIONS,
        dtype: DType = "float32",
        padding_side: PaddingSide = "left",
        gradient_checkpointing: bool = False,
        base_weights_sha256: str | None = None,
    ):
        arguments = {k: v for k, v in locals().items() if k not in ("self", "optimizer", "scheduler",
                                                                      "base_weights_sha256", "__class__")}
        arguments["lora_target_modules"] = list(lora_target_modules)
        if data_collator not in COLLATORS:
            raise ConfigError(f"unknown data_collator {data_collator!r}; valid: {', '.join(COLLATORS)}")
        if mask_token_type not in MASK_TOKEN_TYPES:
            raise ConfigError(f"unknown mask_token_type {mask_token_type!r}; valid: {', '.join(MASK_TOKEN_TYPES)} "
                              "(run_mntp.py's `mask` adds a token, which would change the vocabulary)")
        if not 0.0 < mlm_probability <= 1.0:
            raise ConfigError(f"mlm_probability must be in (0, 1], got {mlm_probability}")
        if pooling_mode not in POOLING_MODES:
            raise ConfigError(f"{self.RECIPE}: LLM2Vec has no pooling mode {pooling_mode!r}; valid: "
                              f"{', '.join(POOLING_MODES)}")
        self._setup(arguments, optimizer, scheduler, base_weights_sha256)
        self.mask_id = self._mask_id()

    def _load(self, name: str, dtype: torch.dtype) -> torch.nn.Module:
        """The causal LM: its base model gets the adapter, its LM head (frozen, not in checkpoints) scores tokens."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = check_model_source(name)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        causal = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        head = causal.get_output_embeddings()
        head.requires_grad_(False)
        self.__dict__["lm_head"] = head  # not a submodule: the frozen head stays out of the adapter checkpoint
        return causal.get_decoder() if hasattr(causal, "get_decoder") else causal.model

    def setup(self, stage: str) -> None:
        return None  # no gradient caching to check: MNTP's loss is per token

    def ddp_gradient_scale(self) -> int:
        """1: `training_step` returns the per-rank token mean unscaled, so under DDP the gradient is the mean of the
        per-rank gradients, what run_mntp.py's Trainer clipped; the clipping threshold is not scaled either."""
        return 1

    def _mask_id(self) -> int:
        """run_mntp.py: the tokenizer's mask token, else `_` (blank) or the EOS token."""
        tokenizer = self.tokenizer
        token = tokenizer.mask_token or ("_" if self.hparams.mask_token_type == "blank" else tokenizer.eos_token)
        ids = tokenizer.convert_tokens_to_ids(token)
        if ids is None or ids == tokenizer.unk_token_id:
            raise ConfigError(f"LLM2VecMNTP: the mask token {token!r} is not in the vocabulary of "
                              f"{self.hparams.model_name_or_path!r}; use mask_token_type=eos")
        return int(ids)

    def mntp_batch(self, sentences: list[str]) -> dict[str, torch.Tensor]:
        """run_mntp.py's line_by_line tokenization (special tokens, cut at `max_sentence_tokens`, special tokens
        mask), padded on the right with the pad token (EOS when none); padding counts as special."""
        tokenizer = self.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        rows = [tokenizer(s, truncation=True, max_length=self.hparams.max_sentence_tokens,
                          return_special_tokens_mask=True) for s in sentences]
        width = max(len(row["input_ids"]) for row in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        special = torch.ones((len(rows), width), dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            n = len(row["input_ids"])
            ids[index, :n] = torch.tensor(row["input_ids"])
            special[index, :n] = torch.tensor(row["special_tokens_mask"])
            attention[index, :n] = 1
        inputs, labels = mntp_mask(ids, special, self.hparams.mlm_probability, self.mask_id, len(tokenizer),
                                   self.hparams.data_collator)
        return {"input_ids": inputs, "attention_mask": attention, "labels": labels}

    def mntp_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     labels: torch.Tensor) -> torch.Tensor:
        """The MNTP loss of a masked batch through the bidirectional model and the frozen LM head."""
        from promptemb.encoder.bidirectional import bidirectional_arguments

        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
        out = self.transformer(input_ids=input_ids, position_ids=positions, use_cache=False,
                               **bidirectional_arguments(self.transformer, attention_mask))
        head = self.lm_head.to(out.last_hidden_state.device)
        return mntp_loss(head(out.last_hidden_state), labels)

    def training_step(self, batch, batch_idx):
        if isinstance(batch, Mapping):
            raise ConfigError("LLM2VecMNTP reads raw sentences; set data.pretokenize=false")
        sentences = [s for item in batch for s in ([item] if isinstance(item, str) else item)]
        masked = {key: value.to(self.device) for key, value in self.mntp_batch(sentences).items()}
        if not (masked["labels"] != -100).any():  # nothing drawn (tiny batches): no loss, no step
            return None
        loss = self.mntp_forward(**masked)
        on_host = loss.detach().to("cpu", torch.float32, copy=True)
        if not torch.isfinite(on_host):
            from promptemb.lightning_modules.base import NonFiniteLossError

            raise NonFiniteLossError(f"loss is {on_host.item()} at step {self.global_step}; lower optimizer.lr")
        self.log("train/loss", on_host, prog_bar=True, batch_size=len(sentences))
        return loss  # per-rank mean; DDP averages gradients as the Hugging Face Trainer does
