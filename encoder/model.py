"""`Encoder`: load any Hugging Face encoder and embed sentences with several poolers from one forward pass."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoConfig

from promptemb.common.bounds import AtLeastOne, TokenLimit
from promptemb.common.compilation import check_compile_works
from promptemb.common.device_profile import exact_matmuls
from promptemb.common.errors import ConfigError
from promptemb.common.instantiate import keywords_of
from promptemb.encoder.decoder import (
    PADDING_SIDES,
    DecoderInputBuilder,
    PaddingSide,
    check_last_token_template,
    is_causal_lm,
    run_decoder,
)
from promptemb.encoder.forward import InputEmbedder, max_input_length, run_transformer
from promptemb.encoder.inputs import Batch, InputBuilder, InputForm
from promptemb.encoder.loading import (
    DTYPES,
    Autocast,
    DType,
    check_backbone_compile,
    check_quantization,
    find_mlm_head,
    load_pretrained,
    quantization_kwargs,
    resolve_autocast,
    resolve_device,
    resolve_model_path,
)
from promptemb.encoder.onednn import LinearPacks, onednn_linears_work
from promptemb.encoder.outputs import EncoderOutput, normalize_layer
from promptemb.encoder.pooling import Needs, Pooler
from promptemb.encoder.template import Template


def combine_needs(poolers: Sequence[Pooler], num_layers: int | None = None) -> Needs:
    """What the poolers need together; with `num_layers`, `layers_from` requests become explicit layer indices."""
    layers = {layer for p in poolers for layer in p.needs.layers}
    if num_layers is not None:
        layers = {normalize_layer(layer, num_layers) for layer in layers}
        for start in (p.needs.layers_from for p in poolers if p.needs.layers_from is not None):
            layers |= set(range(normalize_layer(start, num_layers), num_layers + 1))
    return Needs(
        layers=tuple(sorted(layers)),
        templated=any(p.needs.templated for p in poolers),
        mask_token=any(p.needs.mask_token for p in poolers),
        attentions=any(p.needs.attentions for p in poolers),
        word_embeddings=any(p.needs.word_embeddings for p in poolers),
        mlm_head=any(p.needs.mlm_head for p in poolers),
        template_bias=any(p.needs.template_bias for p in poolers),
        router_logits=any(p.needs.router_logits for p in poolers),
    )


def expand_parts(poolers: Sequence[Pooler]) -> list[Pooler]:
    """The poolers that read a forward pass: each pooler, or the parts of one that averages several (MetaEOL)."""
    return [part for pooler in poolers for part in (pooler.parts() or [pooler])]


def check_poolers_on_config(name_or_path: str, poolers: Sequence[Pooler], revision: str | None = None) -> None:
    """Refuse, from the model's config alone and before any weight loads, the poolers that need a kind of model
    (MoEE reads router logits: a dense model is refused here in one line rather than after loading its weights;
    LLM2Vec's bidirectional attention exists for some families only). A config that cannot be read is left to the
    loading, which reports it."""
    readers = [pooler for pooler in expand_parts(poolers) if pooler.needs.router_logits or pooler.needs.bidirectional]
    if not readers:
        return
    try:
        config = AutoConfig.from_pretrained(resolve_model_path(name_or_path), revision=revision)
    except (OSError, ValueError):
        return
    for pooler in readers:
        pooler.check_model(config)


def reads_run_template(pooler: Pooler) -> bool:
    """Whether a pooler runs on the caller's template (not on the plain sentence, not on a method's own form)."""
    return pooler.input_form() is None and (pooler.needs.templated or pooler.needs.template_bias)


@contextlib.contextmanager
def attention_implementation(transformer: torch.nn.Module, wanted: str | None) -> Iterator[None]:
    """Run the block with `transformer` switched to attention implementation `wanted` (e.g. "eager" so a training
    model in SDPA can return attention probabilities for ditto at evaluation), then switch back. None: unchanged."""
    current = getattr(transformer.config, "_attn_implementation", None)
    if wanted is None or wanted == current:
        yield
        return
    try:
        transformer.set_attn_implementation(wanted)
    except (ValueError, ImportError, AttributeError) as err:
        raise ConfigError(f"model {type(transformer).__name__} cannot switch to {wanted} attention ({err}); "
                          "drop the poolers that need attention probabilities (ditto)") from None
    try:
        yield
    finally:
        transformer.set_attn_implementation(current)


@dataclass
class EncodeStats:
    """Counts of real work done, so tests and benchmarks can check that nothing ran twice."""

    forward_batches: int = 0
    forward_sequences: int = 0
    #: one record per input form encoded: its poolers, sentences, tokens, batches and wall seconds (tokenizing,
    #: forwards and pooling; a decoder method's auxiliary forward included), so methods sharing one run get a cost each
    forms: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Shard:
    """This process's part of an encoding spread over `world_size` processes (torch.distributed): it runs batches
    rank, rank + world_size, ... of every input form, and all processes then exchange their embeddings, so each
    ends with every sentence's embedding, computed in exactly the batches one process would use. Every process must
    make the same encoding calls with the same sentences (the exchange is a collective)."""

    rank: int
    world_size: int

    def gather(self, part: dict) -> list[dict]:
        gathered: list = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, part)
        return gathered


@dataclass(frozen=True)
class Truncation:
    """Which sentences of one `embed` call's input form were cut to `max_sentence_tokens` (in input order)."""

    max_sentence_tokens: int
    truncated: np.ndarray  # bool [N]


#: Inputs per batch where batches go by count (`max_batch_tokens="auto"` on the CPU, or null): every encoder's
#: default, evaluate.py's (configs/backbone/) and the training callback's. A row's float sums can depend on the shape
#: of its batch, so the callback and evaluate.py must batch alike to give a checkpoint the same bits.
BATCH_SIZE = 64

#: `max_batch_tokens="auto"` off the CPU: padded tokens per batch (rows x longest row). MiniLM at this budget keeps a
#: GPU busy (~350 GFLOP per forward) where 64 short sentences (~1,000 tokens) leave it waiting on kernel launches.
DEVICE_BATCH_TOKENS = 16384


def resolve_batch_tokens(max_batch_tokens: int | str | None, device: torch.device) -> int | None:
    """The token budget per batch: an int as given; "auto": `DEVICE_BATCH_TOKENS` on an accelerator, None (batches of
    `batch_size` sentences) on the CPU, where bigger batches run no faster and the float sums of a row can depend on
    its batch's shape (the CPU's scores are those of 64-sentence batches); None: batches by count."""
    if max_batch_tokens == "auto":
        return None if device.type == "cpu" else DEVICE_BATCH_TOKENS
    if max_batch_tokens is not None and (isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int)
                                         or max_batch_tokens < 1):
        raise ConfigError(f"max_batch_tokens must be an integer >= 1, 'auto' or null, got {max_batch_tokens!r}")
    return max_batch_tokens


def batch_spans(lengths: Sequence[int], batch_size: int, max_tokens: int | None) -> list[tuple[int, int]]:
    """[start, stop) of each batch over inputs sorted longest first (`lengths` in that order): `batch_size` inputs
    each, or, with `max_tokens`, as many as fit in that many padded tokens (rows x the batch's first, longest row;
    at least one row), so short sentences travel in big batches and long ones in small ones."""
    if max_tokens is None:
        return [(start, min(start + batch_size, len(lengths))) for start in range(0, len(lengths), batch_size)]
    spans, start = [], 0
    while start < len(lengths):
        stop = min(len(lengths), start + max(1, max_tokens // max(1, int(lengths[start]))))
        spans.append((start, stop))
        start = stop
    return spans


def check_inference_options(dtype: str, compile: bool, parallel_batches: int | str, onednn_linears: bool | str,
                            autocast: str = "none") -> None:
    """The values of `Encoder`'s inference options, and the combinations that cannot run, one line each, before any
    loading ("auto" resolves to what can run: `resolve_cpu_speedups`)."""
    if parallel_batches != "auto" and (isinstance(parallel_batches, bool) or not isinstance(parallel_batches, int)
                                       or parallel_batches < 1):
        raise ConfigError(f"parallel_batches must be an integer >= 1 or 'auto', got {parallel_batches!r}")
    if not isinstance(onednn_linears, bool) and onednn_linears != "auto":
        raise ConfigError(f"onednn_linears must be true, false or 'auto', got {onednn_linears!r}")
    if compile and parallel_batches != "auto" and parallel_batches > 1:
        raise ConfigError("backbone.compile=true runs batches one at a time (compilation is not thread-safe); use "
                          "backbone.parallel_batches=1 with it")
    if compile and onednn_linears is True:
        raise ConfigError("backbone.compile=true packs the linears itself (Inductor's freezing); use "
                          "backbone.onednn_linears=false with it")
    if onednn_linears is True and dtype != "float32":
        raise ConfigError(f"backbone.onednn_linears=true packs float32 weights; the model is loaded as {dtype}: use "
                          "backbone.dtype=float32 or backbone.onednn_linears=false")
    if onednn_linears is True and autocast == "bf16":
        raise ConfigError("backbone.onednn_linears=true multiplies float32 activations; backbone.autocast=bf16 makes "
                          "them bfloat16: use backbone.autocast=auto or none with it")


#: `parallel_batches="auto"` on the CPU: batches encoded at once (each with half the torch threads) where there are at
#: least two torch threads. More batches at once add nothing measurable on MiniLM (docs/benchmarks.md).
AUTO_PARALLEL_BATCHES = 2


def resolve_cpu_speedups(parallel_batches: int | str, onednn_linears: bool | str, *, device: torch.device,
                         decoder: bool, dtype: str, autocast: torch.dtype | None, compiled: bool) -> tuple[int, bool]:
    """(batches encoded at once, whether the linears multiply with oneDNN-packed weights) for an encoder on `device`.
    A value given is kept (its combinations checked by `check_inference_options`, the device and model kind by
    `Encoder.use_inference_options`); "auto" turns each on where it computes the plain path's embeddings to float
    rounding and runs faster: an encoder (not a decoder: its prompt methods hook into the model per call) on the CPU,
    not compiled; oneDNN also only on float32 forwards (no bf16 dtype or autocast) with a torch build whose packed
    linear works. Off the CPU both stay off (a GPU runs one batch at a time, cuBLAS packs nothing)."""
    fast = device.type == "cpu" and not decoder and not compiled
    if parallel_batches == "auto":
        parallel_batches = AUTO_PARALLEL_BATCHES if fast and torch.get_num_threads() >= AUTO_PARALLEL_BATCHES else 1
    if onednn_linears == "auto":
        onednn_linears = fast and dtype == "float32" and autocast is None and onednn_linears_work()
    elif onednn_linears and not onednn_linears_work():
        raise ConfigError("backbone.onednn_linears=true but this torch build has no working oneDNN packed linear "
                          "(torch.backends.mkldnn); drop it")
    return int(parallel_batches), bool(onednn_linears)


@dataclass(frozen=True)
class InferenceOptions:
    """How a frozen encoder runs its forwards (`Encoder.use_inference_options`; what each does: `Encoder.__init__`).
    The `backbone` node keeps them as flat keys (`backbone.autocast=bf16`); evaluate.py's settings build this object
    once and set the same options on a pretrained and on a trained model, so the defaults live here only."""

    compile: bool = False
    autocast: Autocast = "none"
    parallel_batches: AtLeastOne | Literal["auto"] = "auto"
    onednn_linears: bool | Literal["auto"] = "auto"
    max_batch_tokens: AtLeastOne | Literal["auto"] | None = "auto"


class Encoder:
    """A tokenizer + transformer pair that embeds sentences for any set of poolers.

    Each call to `embed` groups the poolers by input form (plain, or templated) and runs the transformer ONCE per
    (sentence, form): length-sorted batches, `inference_mode`, hidden states only when a pooler needs more than the
    last layer, attention probabilities only when a pooler needs them (eager attention).

    `Encoder(name_or_path, ...)` loads a checkpoint; `Encoder.from_model(...)` wraps a model already in memory
    (the training-time evaluation callback), so both score through the same code.
    """

    @keywords_of(InferenceOptions)
    def __init__(
        self,
        name_or_path: str,
        *,
        device: str = "auto",
        batch_size: AtLeastOne = BATCH_SIZE,
        max_length: TokenLimit | None = None,
        dtype: DType = "float32",
        attentions: bool = False,
        mlm_head: bool = False,
        revision: str | None = None,
        progress: bool = True,
        device_map: str | dict | None = None,
        quantization: str | None = None,
        padding_side: PaddingSide = "right",
        **inference,
    ):
        """`device_map` (e.g. "auto") and `quantization` ("4bit", CUDA only) are passed to `from_pretrained` for models
        too big for one device; `padding_side` applies to decoders (results do not depend on it). The keywords of
        `InferenceOptions`: `compile`: run the transformer through torch.compile (Inductor, dynamic shapes, weights
        frozen into the graph, so only for inference): the first batches pay the compilation (minutes on a small CPU),
        later ones run faster (docs/benchmarks.md: worth it for large corpora); refused here when Inductor cannot run on
        this machine. `autocast`: the forwards under bf16 autocast (`bf16`, or `auto`: on CUDA only), pooling and
        similarities in float32. `parallel_batches`: on the CPU, encode that many batches at once (threads sharing the
        torch threads; encoders only). `onednn_linears`: on the CPU, while encoding, the transformer's linears
        multiply with weights packed for oneDNN (encoder/onednn.py: ~10% faster, equal to float rounding; float32
        encoders, not with `compile`). Both default to "auto": on for an encoder on the CPU (the embeddings and scores
        of the plain path to float rounding, faster; `resolve_cpu_speedups`). `max_batch_tokens`: batches of
        length-sorted inputs filled up to that many padded tokens instead of `batch_size` inputs ("auto": 16384 off
        the CPU, by count on the CPU; `resolve_batch_tokens`)."""
        path = resolve_model_path(name_or_path)
        options = InferenceOptions(**inference)
        compile, autocast = options.compile, options.autocast
        resolve_batch_tokens(options.max_batch_tokens, torch.device("cpu"))  # the value only
        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
        if padding_side not in PADDING_SIDES:
            raise ConfigError(f"unknown padding_side {padding_side!r}; valid: {', '.join(PADDING_SIDES)}")
        resolve_autocast(autocast, torch.device("cpu"), dtype)  # the value only: the device is known after loading
        check_quantization(quantization)
        check_inference_options(dtype, compile, options.parallel_batches, options.onednn_linears, autocast)
        if compile:
            check_backbone_compile(path, revision, device)
        placement = {} if device_map is None else {"device_map": device_map}
        tokenizer, model, loading = load_pretrained(
            name_or_path, mlm_head=mlm_head, revision=revision, dtype=DTYPES[dtype],
            attn_implementation="eager" if attentions else "sdpa", **placement, **quantization_kwargs(quantization),
        )
        head = find_mlm_head(model, loading["missing_keys"], name_or_path) if mlm_head else None
        if device_map is not None:  # accelerate placed the weights; inputs go where the first ones are
            device = str(next(model.parameters()).device)
        self._setup(model.base_model if mlm_head else model, tokenizer, name_or_path=name_or_path, path=path,
                    device=device, batch_size=batch_size, max_length=max_length, dtype=dtype,
                    attentions=attentions, mlm_head=head, progress=progress, padding_side=padding_side,
                    autocast=autocast)
        self.model = (model if device_map is not None or quantization else model.to(self.device)).eval()
        #: weights the checkpoint lacks, initialised at random by `from_pretrained` (e.g. BERT's pooler layer), by
        #: their name in `self.model`'s state dict: they differ at every load and no pooler reads them
        self.newly_initialized = tuple(sorted(loading["missing_keys"]))
        self.use_inference_options(options)

    @classmethod
    def from_model(
        cls,
        transformer: torch.nn.Module,
        tokenizer,
        *,
        name: str,
        batch_size: int = BATCH_SIZE,
        max_length: int | None = None,
        mlm_head: torch.nn.Module | None = None,
        input_embedder: InputEmbedder | None = None,
        progress: bool = False,
        padding_side: str = "right",
        autocast: str = "none",
    ) -> Encoder:
        """Wrap an in-memory transformer (left on its device, dtype and train/eval state as given)."""
        encoder = cls.__new__(cls)
        device = next(transformer.parameters()).device
        attentions = getattr(transformer.config, "_attn_implementation", "sdpa") == "eager"
        dtype = {v: k for k, v in DTYPES.items()}.get(next(transformer.parameters()).dtype, "float32")
        encoder._setup(transformer, tokenizer, name_or_path=name, path=name, device=str(device),
                       batch_size=batch_size, max_length=max_length, dtype=dtype, attentions=attentions,
                       mlm_head=mlm_head, progress=progress, input_embedder=input_embedder,
                       padding_side=padding_side, autocast=autocast)
        encoder.model = transformer
        encoder.use_inference_options(InferenceOptions(autocast=autocast))  # the defaults, as `Encoder(...)` has them
        return encoder

    def _setup(self, transformer, tokenizer, *, name_or_path, path, device, batch_size, max_length, dtype,
               attentions, mlm_head, progress, input_embedder=None, padding_side="right",
               autocast="none") -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.name_or_path = name_or_path
        self.path = path
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.dtype = dtype
        self.attentions = attentions
        self.progress = progress
        self.stats = EncodeStats()
        self.shard: Shard | None = None  # set while this process encodes its share of a multi-process encoding
        #: per input form ("plain" / "templated") of the last `embed` call: which sentences were truncated
        self.truncation: dict[str, Truncation] = {}
        self.tokenizer = tokenizer
        self.transformer = transformer
        self.mlm_head = mlm_head
        self.input_embedder = input_embedder
        self.num_layers = int(transformer.config.num_hidden_layers)
        self.num_heads = int(getattr(transformer.config, "num_attention_heads", 0))
        self.hidden_size = int(transformer.config.hidden_size)
        self.max_length = max_input_length(transformer, tokenizer, max_length)
        #: a causal LM: inputs as the decoder prompt methods build them, causal attention, last-token poolers
        self.is_decoder = is_causal_lm(transformer.config)
        self.padding_side = padding_side
        self.autocast = resolve_autocast(autocast, self.device, dtype)
        #: batches encoded at once, and whether each encoding packs the linears for oneDNN (recorded with every
        #: score); `use_inference_options` sets them and the batching
        self.parallel_batches, self.onednn_linears = 1, False
        #: the oneDNN-packed linears, kept between encodings while their weights are unchanged
        self.linear_packs: LinearPacks | None = None
        #: padded tokens per batch (None: `batch_size` inputs per batch)
        self.max_batch_tokens = resolve_batch_tokens("auto", self.device)
        self.compiled = False
        self.newly_initialized: tuple[str, ...] = ()

    def use_inference_options(self, options: InferenceOptions) -> None:
        """How this frozen encoder runs its forwards (see `__init__`); evaluate.py sets the same options on a trained
        model it opened. None changes what is computed beyond float rounding; `compile` takes the weights as they are
        now (inference only) and stays applied; `onednn_linears` packs the weights as they are at each encoding."""
        autocast, compile, parallel_batches = options.autocast, options.compile, options.parallel_batches
        onednn_linears, max_batch_tokens = options.onednn_linears, options.max_batch_tokens
        # a compilation applied by an earlier call stays applied: the combinations are checked with it
        compiled = compile or self.compiled
        check_inference_options(self.dtype, compiled, parallel_batches, onednn_linears, autocast)
        parallel = parallel_batches != "auto" and parallel_batches > 1
        if self.is_decoder and (compile or onednn_linears is True or parallel):
            key = "compile=true" if compile else "onednn_linears=true" if onednn_linears is True else \
                "parallel_batches>1"
            raise ConfigError(f"backbone.{key} is for encoder models; the decoder prompt methods hook into the model "
                              f"per call: drop it")
        if self.device.type != "cpu" and (onednn_linears is True or parallel):
            key = "onednn_linears=true" if onednn_linears is True else f"parallel_batches={parallel_batches}"
            raise ConfigError(f"backbone.{key} speeds up encoding on the CPU; this encoder runs on {self.device}: "
                              "drop it")
        if compile:
            check_compile_works("backbone.compile", self.device.type)
        self.autocast = resolve_autocast(autocast, self.device, self.dtype)
        self.max_batch_tokens = resolve_batch_tokens(max_batch_tokens, self.device)
        self.parallel_batches, self.onednn_linears = resolve_cpu_speedups(
            parallel_batches, onednn_linears, device=self.device, decoder=self.is_decoder, dtype=self.dtype,
            autocast=self.autocast, compiled=compiled)
        if not self.onednn_linears:
            self.linear_packs = None
        elif self.linear_packs is None:
            self.linear_packs = LinearPacks(self.transformer)
        if compile and not self.compiled:  # in place: parameter names, hooks and `self.model`'s weights unchanged
            self.transformer.compile(dynamic=True, options={"freezing": True})
            self.compiled = True

    def describe(self) -> dict:
        return {
            "name_or_path": self.name_or_path,
            "resolved_path": self.path,
            "class": type(self.model).__name__,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_size": self.hidden_size,
            "max_length": self.max_length,
            "dtype": self.dtype,
            "attention": getattr(self.transformer.config, "_attn_implementation", None) or "sdpa",
            "autocast": "bf16" if self.autocast is not None else "none",
            "linear_kernels": "onednn_packed" if self.onednn_linears else "default",
            "parallel_batches": self.parallel_batches,
            "compiled": self.compiled,
            "batching": (f"{self.max_batch_tokens} padded tokens" if self.max_batch_tokens
                         else f"{self.batch_size} inputs"),
            "decoder": self.is_decoder,
            **({"padding_side": self.padding_side} if self.is_decoder else {}),
        }

    # -- validation -----------------------------------------------------------------------------------------------

    def check_poolers(self, poolers: Sequence[Pooler], template: Template | None) -> None:
        """Fail before any forward pass if a pooler cannot run with this model and template."""
        for pooler in expand_parts(poolers):
            needs = pooler.needs
            self.check_model_kind(pooler)
            own = pooler.input_form()
            if own is not None:  # a decoder method's own template (or Echo's), checked here instead of the run's
                if own.decoder is None or (own.decoder.echo_template is None and own.decoder.llm2vec is None):
                    check_last_token_template(pooler.name, own.template)
            elif needs.decoder and needs.templated:  # a decoder pooler on the run's template (last_token)
                check_last_token_template(pooler.name, template)
            for layer in needs.layers:
                normalize_layer(layer, self.num_layers)
            if needs.layers_from is not None:
                normalize_layer(needs.layers_from, self.num_layers)
            pooler.check_model(self.transformer.config)
            pooler.bind_tokenizer(self.tokenizer)
            pooler.bind_encoder(self)
            if (needs.templated or needs.template_bias) and template is None and own is None:
                raise ConfigError(
                    f"pooler {pooler.name!r} pools over a prompt-templated input; pass a template, "
                    "e.g. template='This sentence : \"[X]\" means [MASK] .'"
                )
            if needs.mask_token or needs.template_bias:
                template.require_mask(f"pooler {pooler.name!r}")
                if self.tokenizer.mask_token_id is None:
                    raise ConfigError(
                        f"pooler {pooler.name!r} needs a [MASK] token but model {self.name_or_path!r} has none; "
                        "use a masked-language model or another pooler"
                    )
            if needs.mlm_head and self.mlm_head is None:
                raise ConfigError(
                    f"pooler {pooler.name!r} needs the MLM head; load the encoder with mlm_head=true "
                    "(a checkpoint with a masked-language-model head)"
                )
            if needs.attentions and not self.attentions:
                raise ConfigError(
                    f"pooler {pooler.name!r} needs attention probabilities; load the encoder with attentions=true "
                    "(eager attention)"
                )

    def check_model_kind(self, pooler: Pooler) -> None:
        """Decoder prompt methods need a causal LM; [MASK]-based poolers need a masked-language model."""
        kind = f"{type(self.transformer).__name__}, {'a decoder (causal LM)' if self.is_decoder else 'an encoder'}"
        if pooler.needs.decoder and not self.is_decoder:
            raise ConfigError(f"pooler {pooler.name!r} is a decoder prompt method (last token of a causal LM), but "
                              f"model {self.name_or_path!r} is {kind}; use mask, mean or another encoder pooler")
        needs = pooler.needs
        if self.is_decoder and (needs.mask_token or needs.template_bias or needs.mlm_head):
            raise ConfigError(f"pooler {pooler.name!r} pools the template's [MASK] of a masked-language model, but "
                              f"model {self.name_or_path!r} is {kind}; use last_token, prompteol or another decoder "
                              "method")

    # -- encoding -------------------------------------------------------------------------------------------------

    def embed(
        self,
        sentences: Sequence[str],
        poolers: Sequence[Pooler],
        template: Template | None = None,
        sentence_rule: str = "none",
        max_sentence_tokens: int | None = None,
        *,
        batch_size: int | None = None,
        progress: bool | None = None,
    ) -> dict[str, np.ndarray]:
        """Embed `sentences` with every pooler; returns pooler name -> float32 array [N, D].

        Poolers that share an input form share one forward pass per sentence. `batch_size` / `progress` apply to this
        call only (None: the encoder's own; a `batch_size` given here batches this call by count).
        """
        self.check_poolers(poolers, template)
        by_form: dict[InputForm, list[Pooler]] = defaultdict(list)
        for pooler in expand_parts(poolers):
            own = pooler.input_form()
            if own is not None:
                by_form[replace(own, max_sentence_tokens=max_sentence_tokens)].append(pooler)
                continue
            by_form[InputForm(template if reads_run_template(pooler) else None, sentence_rule,
                              max_sentence_tokens)].append(pooler)
        embeddings: dict[str, np.ndarray] = {}
        self.truncation = {}
        for form, form_poolers in by_form.items():
            embeddings.update(self.encode_form(sentences, form_poolers, form, batch_size=batch_size,
                                               progress=progress))
        for pooler in poolers:
            if pooler.parts():  # MetaEOL's prompts, an ensemble's members: combined by the pooler
                embeddings[pooler.name] = pooler.combine(embeddings)
        return {pooler.name: embeddings[pooler.name] for pooler in poolers}

    def input_builder(self, form: InputForm) -> InputBuilder | DecoderInputBuilder:
        if self.is_decoder:
            return DecoderInputBuilder(self.tokenizer, form, self.max_length, self.padding_side)
        return InputBuilder(self.tokenizer, form, self.max_length)

    def encode_form(
        self, sentences: Sequence[str], poolers: Sequence[Pooler], form: InputForm, *, batch_size: int | None = None,
        progress: bool | None = None,
    ) -> dict[str, np.ndarray]:
        """One input form: tokenize all, sort by length, one forward per batch (`batch_spans`: by count, or by token
        budget with `max_batch_tokens`), every pooler on every batch."""
        max_tokens = self.max_batch_tokens if batch_size is None else None
        batch_size = self.batch_size if batch_size is None else int(batch_size)
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        progress = self.progress if progress is None else bool(progress)
        started = time.perf_counter()
        builder = self.input_builder(form)
        items = builder.build(list(sentences))
        label = "templated" if form.template else "plain"
        self.truncation[label] = Truncation(builder.max_sentence_tokens, np.array([i.truncated for i in items], bool))
        lengths = np.array([len(item.input_ids) for item in items], dtype=np.int64)
        order = np.argsort(-lengths, kind="stable")
        needs = combine_needs(poolers, self.num_layers)
        spans = batch_spans(lengths[order], batch_size, max_tokens)
        mine = spans if self.shard is None else spans[self.shard.rank :: self.shard.world_size]
        parts: dict[int, dict[str, torch.Tensor]] = {}  # batch start -> pooler name -> [rows, D]

        def encode_batch(span: tuple[int, int]) -> tuple[int, dict[str, torch.Tensor]]:
            start, stop = span
            batch = builder.collate([items[i] for i in order[start:stop]])
            with torch.inference_mode():
                region = (contextlib.nullcontext() if self.autocast is None
                          else torch.autocast(self.device.type, dtype=self.autocast))
                with region:
                    out = self.forward(batch, needs, builder)
                if self.autocast is not None:
                    out = out.in_float32()
                return start, {pooler.name: pooler(out).float().cpu() for pooler in poolers}

        bar = tqdm(total=len(mine), desc=f"encode ({label})", unit="batch", disable=not progress, leave=False)
        # scores must not depend on the device: float32 forwards use IEEE matmuls even where training turned TF32 on
        with bar, self.linear_kernels(), self.cpu_workers() as run, exact_matmuls():
            for start, pooled in run(encode_batch, mine):
                parts[start] = pooled
                bar.update()
        if self.shard is not None:
            for other in self.shard.gather(parts):
                parts.update(other)
        result = {}
        for pooler in poolers:
            stacked = torch.cat([parts[start][pooler.name] for start, _ in spans]).numpy()
            unsorted = np.empty_like(stacked)
            unsorted[order] = stacked
            result[pooler.name] = unsorted
        self.stats.forms.append({"input": label, "poolers": [pooler.name for pooler in poolers],
                                 "sentences": len(items), "tokens": int(lengths.sum()), "batches": len(mine),
                                 "seconds": round(time.perf_counter() - started, 2)})
        return result

    def linear_kernels(self) -> contextlib.AbstractContextManager:
        """The block's linears: oneDNN's packed copies of the weights as they are now (`onednn_linears`, on the CPU),
        the model's own modules put back after it (`LinearPacks`: a model that trains between two encodings is
        never encoded with stale weights), or the model's own."""
        if self.linear_packs is None or self.device.type != "cpu":
            return contextlib.nullcontext()
        return self.linear_packs.swapped_in()

    @contextlib.contextmanager
    def cpu_workers(self) -> Iterator[Callable]:
        """A `map` over batches: with `parallel_batches` > 1 on the CPU, that many threads each running whole
        batches with threads/parallel_batches intra-op threads (small matmuls scale better across batches than
        inside one, and no OpenMP thread spins waiting for a core another job holds); otherwise the plain sequential
        map. Decoders stay sequential: their prompt methods register forward hooks per call on the shared model."""
        if self.parallel_batches <= 1 or self.device.type != "cpu" or self.is_decoder:
            yield map
            return
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, threads // self.parallel_batches))
        pool = ThreadPoolExecutor(self.parallel_batches, thread_name_prefix="encode")
        try:
            yield pool.map  # in order: a batch's result is taken as soon as it and those before it are done
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # a failed batch: the queued ones do not run
            torch.set_num_threads(threads)

    def forward(self, batch: Batch, needs: Needs, builder: InputBuilder | None = None) -> EncoderOutput:
        """Run the transformer once (or not at all when only word embeddings are needed)."""
        batch = batch.to(self.device)
        if self.is_decoder:
            out = run_decoder(self.transformer, batch, needs, builder.form if builder is not None else InputForm())
        else:
            out = run_transformer(self.transformer, batch, needs, builder=builder,
                                  input_embedder=self.input_embedder, mlm_head=self.mlm_head,
                                  mask_only_when_padded=True)
        if needs.attentions and not out.attentions:
            raise ConfigError(
                f"model {self.name_or_path!r} ({type(self.transformer).__name__}) returned no attention "
                "probabilities; poolers that weight tokens by attention (ditto) need a model that supports "
                "eager attention"
            )
        if out.hidden_states or out.attentions is not None or out.router_logits is not None:
            self.stats.forward_batches += 1
            self.stats.forward_sequences += batch.input_ids.shape[0]
        return out
