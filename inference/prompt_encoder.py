"""`load_encoder(path).encode(sentences)`: a trained prompt encoder with its recorded template and pooler.

Loads a train.py checkpoint (.ckpt) or an export directory (export.py) and embeds with the framework's own
`Encoder` + poolers, i.e. exactly the code the checkpoint was scored with. `record()` is what an export writes into
the `promptemb` block of its config.json; `from_export` reads it back. Decoders (causal LMs) pool the last token of
their template (`last_token`, PromptEOL-style); a checkpoint of the LoRA recipe is loaded with its adapter, merged
into the weights or kept as a peft adapter on the recorded base model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.version import framework_version
from promptemb.data.checksums import sha256_file
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.loading import SENTENCE_TRANSFORMERS_CONFIG, resolve_device, sentence_transformers_limit
from promptemb.encoder.model import Encoder
from promptemb.encoder.sources import export_block
from promptemb.encoder.template import SENTENCE_SLOT, Template
from promptemb.lightning_modules.checkpoint import LINEAGE_KEY, load_module_checkpoint, read_checkpoint
from promptemb.lightning_modules.deep_prompt import DEEP_PROMPT_CONFIG, DEEP_PROMPT_FILE, DeepPrompt
from promptemb.lightning_modules.heads import MLMTransformHead, MLPHead
from promptemb.lightning_modules.recipe import recipe_of_checkpoint, recipe_record
from promptemb.lightning_modules.soft_template import SoftTemplate
from promptemb.poolers.base import Pooler
from promptemb.poolers.cls import CLSPooler
from promptemb.poolers.decoder import PROMPTEOL, LastTokenPooler
from promptemb.poolers.llm2vec import SETTINGS as LLM2VEC_SETTINGS
from promptemb.poolers.llm2vec import LLM2VecPooler
from promptemb.poolers.mask import MaskPooler
from promptemb.poolers.mean import MeanPooler

FORMAT_VERSION = 1
POOLERS = ("mask", "avg", "last_token", "cls", "llm2vec")
#: the one pooler a decoder (causal LM) exports: its template's last token
DECODER_POOLER = "last_token"
#: what a bidirectional decoder exports: the LLM2Vec pooling its checkpoint records
LLM2VEC_POOLER = "llm2vec"
#: `from_pretrained(pooler="mean")`: sentence-transformers' mean pooling, `avg` over the plain sentence `[X]`
PLAIN_MEAN = "mean"
HEAD_FILE = "promptemb_head.safetensors"
SOFT_TEMPLATE_FILE = "promptemb_soft_template.safetensors"
#: Files of an export that hold weights; each one's sha256 is recorded in the `promptemb` block at export.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")
UNVERIFIED_HINT = ("pass allow_unverified_weights=true (evaluate.py) or verify_weights=False (load_encoder) to use "
                   "it anyway, recorded as an unverified model")


def weight_files(directory: Path) -> list[Path]:
    return sorted(path for path in Path(directory).rglob("*") if path.is_file() and path.suffix in WEIGHT_SUFFIXES
                  and not path.name.startswith("."))


def weight_files_sha256(directory: Path) -> dict[str, str]:
    """sha256 of every weight file of an export directory, by path relative to it."""
    return {path.relative_to(directory).as_posix(): sha256_file(path, cached=False) for path in weight_files(directory)}


def weight_mismatches(directory: Path, recorded: dict[str, str]) -> list[str]:
    """How the weight files of `directory` differ from the sha256 recorded at export, one phrase per file."""
    actual = weight_files_sha256(directory)
    problems = []
    for name, expected in sorted(recorded.items()):
        if name not in actual:
            problems.append(f"{name} is missing")
        elif actual[name] != expected:
            problems.append(f"{name} has sha256 {actual[name][:12]}..., not the {expected[:12]}... exported")
    problems += [f"{name} was not part of the export" for name in sorted(set(actual) - set(recorded))]
    return problems


def verify_export_weights(directory: Path, record: dict, verify: bool = True) -> dict:
    """Check the export's weight files against the sha256 recorded at export; returns what provenance records about
    it. A mismatch is a one-line DataError unless `verify` is False (then the model is recorded as unverified)."""
    recorded = record.get("weights_sha256")
    if not isinstance(recorded, dict):
        return {"weights_verified": None, "weights_note": "exported without weight hashes (before they were recorded)"}
    problems = weight_mismatches(directory, recorded)
    if problems and verify:
        raise DataError(f"{directory}: the weights are not the ones exported ({'; '.join(problems)}); re-export the "
                        f"checkpoint, or {UNVERIFIED_HINT}")
    if problems:
        return {"weights_verified": False, "weights_note": "; ".join(problems), "weights_sha256": recorded}
    return {"weights_verified": True, "weights_sha256": recorded}


class PromptEncoder:
    """A transformer + tokenizer + template + ONE pooler (mask, optionally denoised / with a head, or avg)."""

    def __init__(
        self,
        transformer: torch.nn.Module,
        tokenizer,
        *,
        template: str | None,
        sentence_rule: str = "none",
        pooler: str = "mask",
        layer: int = -1,
        denoise: bool = False,
        head: torch.nn.Module | None = None,
        head_after_denoise: bool = False,
        which_mask: int | None = None,
        soft_template: SoftTemplate | None = None,
        deep_prompt: DeepPrompt | None = None,
        max_length: int | None = None,
        max_sentence_tokens: int | None = None,
        batch_size: int = 64,
        source: dict | None = None,
        padding_side: str = "left",
        adapter: dict | None = None,
        llm2vec: dict | None = None,
    ):
        """Decoders: `pooler="last_token"` (the template's last token at `layer`), `padding_side` as the framework's
        decoder inputs (embeddings do not depend on it), `adapter` the record of a kept LoRA adapter (base model
        name and weights sha256) when `transformer` is a peft model. `deep_prompt`: trained prefixes, attached to
        `transformer` here (its forwards attend over them); `pooler="cls"` is its [CLS] (through `head` if given).
        `pooler="llm2vec"` (a bidirectional decoder's recorded pooling; `template` None): `llm2vec` holds the
        `LLM2VecPooler`'s pooling_mode, instruction, eos and skip_instruction; the decoder runs bidirectionally."""
        if pooler not in POOLERS:
            raise ConfigError(f"unknown export pooler {pooler!r}; valid: {', '.join(POOLERS)}")
        if deep_prompt is not None and pooler not in ("cls", "avg"):
            raise ConfigError(f"a model with deep prompts (trained prefixes in every layer) exports pooler=cls or avg, "
                              f"not {pooler}")
        if (pooler == LLM2VEC_POOLER) != (llm2vec is not None):
            raise ConfigError("pooler=llm2vec is the pooling a bidirectional decoder's checkpoint records; export that "
                              "checkpoint (the pooling comes from it), or use another pooler")
        self.deep_prompt = deep_prompt
        if deep_prompt is not None:
            deep_prompt.attach(transformer)
        self.template = None if template is None else Template(template)
        self.sentence_rule = sentence_rule
        self.pooler_name = pooler
        self.layer, self.denoise, self.head = layer, bool(denoise) and pooler == "mask", head
        self.head_after_denoise = head_after_denoise
        self.which_mask = which_mask if pooler == "mask" else None
        if self.which_mask is not None and self.denoise:
            raise ConfigError("pooler=mask pooling one [MASK] of several (which_mask) cannot be denoised: the template "
                              "bias at inference is the mean over the template's [MASK]s; drop denoise")
        self.soft_template = soft_template
        self.source = dict(source or {})
        self.adapter = adapter
        self.encoder = Encoder.from_model(transformer, tokenizer, name=self.source.get("base_model", "exported"),
                                          batch_size=batch_size, max_length=max_length, input_embedder=soft_template,
                                          padding_side=padding_side)
        self.is_decoder = self.encoder.is_decoder
        if self.is_decoder != (pooler in (DECODER_POOLER, LLM2VEC_POOLER)):
            kind = "a decoder (causal LM)" if self.is_decoder else "an encoder"
            valid = DECODER_POOLER if self.is_decoder else "mask or avg"
            raise ConfigError(f"pooler={pooler} cannot be exported for {type(transformer).__name__}, {kind}: use "
                              f"pooler={valid}")
        if llm2vec is not None:  # its own input form: the sentence in LLM2Vec's format, no template
            self.pooler: Pooler = LLM2VecPooler(LLM2VEC_POOLER, layer=layer, **llm2vec)
            self.encoder.check_poolers([self.pooler], None)
            own = self.pooler.input_form()
            self.builder = self.encoder.input_builder(InputForm(None, sentence_rule, max_sentence_tokens,
                                                                own.decoder))
            self.max_sentence_tokens = self.builder.max_sentence_tokens
            return
        if self.is_decoder and "<PST>" in self.template.text:
            raise ConfigError(f"template {self.template.text!r} has a Token Prepending slot; its hooks are not part "
                              "of an export: export a plain last-token template")
        self.builder = self.encoder.input_builder(InputForm(self.template, sentence_rule, max_sentence_tokens))
        self.max_sentence_tokens = self.builder.max_sentence_tokens
        if pooler == "cls":
            self.pooler = CLSPooler("cls", layer, head=head)
        elif pooler == "mask":
            self.pooler = MaskPooler("mask", layer=layer, denoise=self.denoise, head=head,
                                             head_after_denoise=head_after_denoise, which_mask=self.which_mask)
        elif pooler == "avg":
            self.pooler = MeanPooler("avg", layers=(layer,), templated=True)
        else:
            self.pooler = LastTokenPooler(DECODER_POOLER, layer=layer)
        self.encoder.check_poolers([self.pooler], self.template)

    @property
    def transformer(self) -> torch.nn.Module:
        return self.encoder.transformer

    @property
    def tokenizer(self):
        return self.encoder.tokenizer

    def to(self, device: str | torch.device) -> PromptEncoder:
        for part in (self.encoder.transformer, self.head, self.soft_template, self.deep_prompt):
            if part is not None:
                part.to(device)
        self.encoder.device = torch.device(device)
        return self

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def encode(
        self,
        sentences: str | list[str],
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device: str | torch.device | None = None,
        normalize_embeddings: bool = False,
    ) -> np.ndarray | torch.Tensor | list[torch.Tensor]:
        """Embeddings as `SentenceTransformer.encode` returns them, with its argument names and defaults: a float32
        array [N, D] (a single string gives [D]); `convert_to_tensor` a tensor on the model's device (it wins over
        `convert_to_numpy`); neither: a list of tensors. `batch_size`, `show_progress_bar` and `device` hold for this
        call only: the encoder is left as it was (on a `device` other than its own it is moved there and back)."""
        single = isinstance(sentences, str)
        sentences = [sentences] if single else list(sentences)
        home = self.device
        target = home if device is None else resolve_device(device)
        if target != home:
            self.to(target)
        try:
            if sentences:
                embeddings = torch.from_numpy(self.encoder.embed(
                    sentences, [self.pooler], self.template, self.sentence_rule, self.max_sentence_tokens,
                    batch_size=batch_size, progress=show_progress_bar)[self.pooler.name].astype(np.float32))
            else:
                embeddings = torch.zeros((0, self.encoder.hidden_size), dtype=torch.float32)
        finally:
            if target != home:
                self.to(home)
        if normalize_embeddings:
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        if convert_to_tensor:
            embeddings = embeddings.to(target)
            return embeddings[0] if single else embeddings
        if convert_to_numpy:
            array = embeddings.numpy()
            return array[0] if single else array
        rows = [row.to(target) for row in embeddings]
        return rows[0] if single else rows

    @staticmethod
    def similarity(embeddings1, embeddings2) -> torch.Tensor:
        """Cosine similarity matrix [N, M] of two sets of embeddings (arrays, tensors or lists of rows), as
        `SentenceTransformer.similarity` with its default (cosine) similarity function."""
        return unit_rows(embeddings1) @ unit_rows(embeddings2).T

    @staticmethod
    def similarity_pairwise(embeddings1, embeddings2) -> torch.Tensor:
        """Cosine similarity of each pair of rows [N]."""
        return (unit_rows(embeddings1) * unit_rows(embeddings2)).sum(1)

    # -- records --------------------------------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The `promptemb` block of an export's config.json: everything needed to rebuild the inputs and pooler."""
        config = self.transformer.config
        if self.is_decoder:
            return self._decoder_record()
        return {
            "format_version": FORMAT_VERSION,
            "framework_version": framework_version(),
            "template": self.template.text,
            "sentence_rule": self.sentence_rule,
            "prefix_ids": list(self.builder.prefix_ids),
            "suffix_ids": list(self.builder.suffix_ids),
            "sentence_leading_space": self.builder.sentence_leading_space,
            "max_length": self.encoder.max_length,
            "max_sentence_tokens": self.max_sentence_tokens,
            "pooler": {
                "name": self.pooler_name,
                "layer": self.layer,
                "layers": [self.layer],
                "denoise": self.denoise,
                "head": None if self.head is None else {
                    "type": "tanh_mlp", "file": HEAD_FILE, "after_denoise": self.head_after_denoise,
                } if isinstance(self.head, MLPHead) else {
                    "type": "mlm_transform", "file": HEAD_FILE,
                    "activation": getattr(config, "hidden_act", "gelu"),
                    "layer_norm_eps": float(getattr(config, "layer_norm_eps", 1e-12)),
                },
                **({} if self.which_mask is None else {"which_mask": self.which_mask}),
            },
            "soft_template": None if self.soft_template is None else {"file": SOFT_TEMPLATE_FILE,
                                                                      "size": len(self.soft_template.vectors)},
            "deep_prompt": None if self.deep_prompt is None else {
                "file": DEEP_PROMPT_FILE, "config": DEEP_PROMPT_CONFIG, "length": self.deep_prompt.length,
                "positions": "token positions start after the prefix (transformers 4.x with past_key_values)"},
            "source": self.source,
        }

    def _decoder_record(self) -> dict[str, Any]:
        """A decoder's record: the filled template is tokenized as one string (no fixed template ids), framed by the
        tokenizer's own special ids, padded on `padding_side` with position ids counted over real tokens, and the
        last real token (the template's last token) pooled at `layer`."""
        builder = self.builder
        return {
            "format_version": FORMAT_VERSION,
            "framework_version": framework_version(),
            "model_kind": "decoder",
            "template": None if self.template is None else self.template.text,
            "sentence_rule": self.sentence_rule,
            "prefix_ids": None,
            "suffix_ids": None,
            "sentence_leading_space": False,
            "max_length": self.encoder.max_length,
            "max_sentence_tokens": self.max_sentence_tokens,
            "decoder": {
                "padding_side": self.encoder.padding_side,
                "pad_id": int(builder.pad_id),
                "special_prefix_ids": [int(i) for i in builder.prefix_specials],
                "special_suffix_ids": [int(i) for i in builder.suffix_specials],
                "position_ids": "real tokens counted from 0 (attention_mask.cumsum - 1)",
            },
            "pooler": {"name": self.pooler_name, "layer": self.layer, "layers": [self.layer], "denoise": False,
                       "head": None},
            "llm2vec": self._llm2vec_record(),
            "soft_template": None,
            "adapter": self.adapter,
            "source": self.source,
        }

    def _llm2vec_record(self) -> dict | None:
        """LLM2Vec's input format and pooling (poolers/llm2vec.py), with the resolved `eos_token` end text."""
        if not isinstance(self.pooler, LLM2VecPooler):
            return None
        return {**self.pooler.settings(), "eos_suffix": self.pooler.decoder.llm2vec.suffix,
                "attention": "bidirectional"}

    # -- constructors ---------------------------------------------------------------------------------------------

    @classmethod
    def from_module(cls, module, *, pooler: str | None = None, denoise: bool | None = None,
                    adapter: str | None = None, batch_size: int = 64, source: dict | None = None) -> PromptEncoder:
        """A trained module as its recipe says it encodes (`encoding_spec`: its primary evaluation pooler with the
        denoising, head, soft template or deep prompts it is scored with; `pooler`, `denoise` and `adapter` as the
        recipe allows)."""
        spec = module.encoding_spec(pooler=pooler, denoise=denoise, adapter=adapter)
        recorded = {**recipe_record(module), "base_model": module.hparams.model_name_or_path}
        return cls(**spec.arguments(), max_sentence_tokens=None, batch_size=batch_size,
                   source={"recipe": recorded["name"], "module": recorded["class"],
                           "base_model": recorded["base_model"], **matryoshka_record(module), **spec.source,
                           **(source or {})})

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, base_model: str | None = None, pooler: str | None = None,
                        denoise: bool | None = None, adapter: str | None = None, batch_size: int = 64) -> PromptEncoder:
        """A train.py checkpoint, encoded as its recipe says (`from_module`); the recipe's options are checked before
        the weights load (a LoRA recipe's `adapter` "merge" = full weights, "keep" / None = the peft model on its
        base)."""
        checkpoint = read_checkpoint(path)
        recipe_of_checkpoint(checkpoint, path).check_encoding_options(
            Path(path), checkpoint["hyper_parameters"], pooler=pooler, denoise=denoise, adapter=adapter)
        loaded = load_module_checkpoint(path, base_model)
        source = {"checkpoint": str(Path(path).resolve()), "checkpoint_sha256": loaded.sha256,
                  "global_step": loaded.global_step, **training_data(checkpoint)}
        return cls.from_module(loaded.module, pooler=pooler, denoise=denoise, adapter=adapter, batch_size=batch_size,
                               source=source)

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, template: str | None = None, sentence_rule: str | None = None,
                        pooler: str | None = None, layer: int = -1, max_length: int | None = None,
                        max_sentence_tokens: int | None = None, padding_side: str = "left",
                        batch_size: int = 64) -> PromptEncoder:
        """A plain (untrained by promptemb) encoder or decoder with a template. None: an encoder reads the plain
        sentence (`[X]`), a decoder PromptEOL's template (rule `prompteol`), since the last token of the plain sentence
        summarises nothing; decoders pool the last token, encoders the template's [MASK] when it has one, else the
        mean (`avg`).
        `pooler="mean"`: an encoder's mean pooling as sentence-transformers computes it, the average over
        `[CLS] sentence [SEP]`, i.e. `avg` over the template `[X]` (recorded so). `max_length` None: the model's own
        token limit as sentence-transformers sets it (`sentence_bert_config.json`, else the position table and the
        tokenizer); `source["token_limit"]` records which."""
        if pooler == PLAIN_MEAN and template not in (None, SENTENCE_SLOT):
            raise ConfigError(f"pooler=mean averages the sentence's own tokens, without a template; drop template= "
                              f"(or use pooler=avg, the average over the templated input {template!r})")
        own_limit = sentence_transformers_limit(name_or_path) if max_length is None else None
        encoder = Encoder(name_or_path, device="cpu", batch_size=batch_size, max_length=max_length or own_limit,
                          padding_side=padding_side, progress=False)
        if template is None and encoder.is_decoder and pooler != PLAIN_MEAN:
            template, sentence_rule = PROMPTEOL, sentence_rule if sentence_rule not in (None, "none") else "prompteol"
        template, sentence_rule = template or SENTENCE_SLOT, sentence_rule or "none"
        if pooler == PLAIN_MEAN:
            if encoder.is_decoder:
                raise ConfigError(f"pooler=mean is an encoder's mean pooling; {name_or_path} is a decoder (causal LM), "
                                  f"which pools the last token: use pooler={DECODER_POOLER}")
            pooler = "avg"
        default = DECODER_POOLER if encoder.is_decoder else "mask" if "[MASK]" in template else "avg"
        limit = ("the max_length argument" if max_length is not None
                 else f"{SENTENCE_TRANSFORMERS_CONFIG} max_seq_length" if own_limit is not None
                 else "the position table and the tokenizer's model_max_length")
        return cls(encoder.transformer.eval(), encoder.tokenizer, template=template, sentence_rule=sentence_rule,
                   pooler=pooler or default, layer=layer, max_length=encoder.max_length,
                   max_sentence_tokens=max_sentence_tokens, batch_size=batch_size, padding_side=padding_side,
                   source={"module": None, "base_model": name_or_path, "training_data": None, "token_limit": limit,
                           "newly_initialized": list(encoder.newly_initialized)})

    @classmethod
    def from_export(cls, directory: str | Path, *, pooler: str | None = None, batch_size: int = 64,
                    device: str | None = None, verify_weights: bool = True,
                    base_model: str | None = None) -> PromptEncoder:
        """`device` None / "auto": CUDA when present. The weight files are checked against the sha256 recorded at
        export first (`verify_weights=False`: loaded anyway, recorded as unverified in `source`). An export that
        kept a LoRA adapter loads its recorded base model (or `base_model`), checked against the recorded sha256."""
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        directory = Path(directory)
        device = resolve_device(device)
        record = read_export_record(directory)
        verification = verify_export_weights(directory, record, verify_weights)
        if record.get("decoder"):
            return cls._from_decoder_export(directory, record, verification, device, batch_size, base_model)
        transformer = load_exported_transformer(directory).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(directory)
        spec = record["pooler"]
        head, head_after_denoise = None, False
        if spec.get("head") and (pooler or spec["name"]) in ("mask", "cls"):
            if spec["head"].get("type") == "tanh_mlp":
                head = MLPHead(transformer.config.hidden_size)
                head_after_denoise = bool(spec["head"].get("after_denoise"))
            else:
                head = MLMTransformHead(transformer.config.hidden_size, spec["head"]["activation"],
                                        spec["head"]["layer_norm_eps"])
            head.load_state_dict(load_file(directory / spec["head"]["file"]))
            head.to(device).eval()
        soft = None
        if record.get("soft_template"):
            soft = SoftTemplate(record["prefix_ids"] + record["suffix_ids"], tokenizer.mask_token_id,
                                transformer.get_input_embeddings())
            soft.load_state_dict(load_file(directory / record["soft_template"]["file"]))
            soft.to(device).eval()
        deep = DeepPrompt.load(directory).to(device).eval() if record.get("deep_prompt") else None
        encoder = cls(transformer, tokenizer, template=record["template"], sentence_rule=record["sentence_rule"],
                      pooler=pooler or spec["name"], layer=spec["layer"], denoise=spec["denoise"], head=head,
                      head_after_denoise=head_after_denoise, which_mask=spec.get("which_mask"),
                      soft_template=soft, deep_prompt=deep, max_length=record["max_length"],
                      max_sentence_tokens=record["max_sentence_tokens"], batch_size=batch_size,
                      source={**record.get("source", {}), "export_dir": str(directory.resolve()), **verification})
        if encoder.builder.prefix_ids != record["prefix_ids"] or encoder.builder.suffix_ids != record["suffix_ids"]:
            raise DataError(f"{directory}: the tokenizer does not reproduce the recorded template ids")
        return encoder


    @classmethod
    def _from_decoder_export(cls, directory: Path, record: dict, verification: dict, device: torch.device,
                             batch_size: int, base_model: str | None) -> PromptEncoder:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory)
        if record.get("adapter"):
            transformer = load_kept_adapter(directory, record["adapter"], base_model)
        else:
            transformer = load_exported_transformer(directory)
        spec, decoder, llm2vec = record["pooler"], record["decoder"], record.get("llm2vec")
        if llm2vec is not None:  # the pooling's settings (the record also holds what they resolved to)
            llm2vec = {key: llm2vec[key] for key in LLM2VEC_SETTINGS}
        encoder = cls(transformer.to(device).eval(), tokenizer, template=record["template"],
                      sentence_rule=record["sentence_rule"], pooler=spec["name"], llm2vec=llm2vec, layer=spec["layer"],
                      max_length=record["max_length"], max_sentence_tokens=record["max_sentence_tokens"],
                      batch_size=batch_size, padding_side=decoder["padding_side"], adapter=record.get("adapter"),
                      source={**record.get("source", {}), "export_dir": str(directory.resolve()), **verification})
        frame = [list(encoder.builder.prefix_specials), list(encoder.builder.suffix_specials)]
        if frame != [decoder["special_prefix_ids"], decoder["special_suffix_ids"]]:
            raise DataError(f"{directory}: the tokenizer does not add the recorded special tokens")
        return encoder


def load_exported_transformer(directory: Path) -> torch.nn.Module:
    """The export's transformer (CPU); weights that do not load (unverified, or exported before hashes were
    recorded) are one DataError line, not a safetensors/torch traceback."""
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(directory)
    except Exception as err:
        raise DataError(f"{directory}: the model weights do not load ({type(err).__name__}: "
                        f"{(str(err).splitlines() or [''])[0]}); re-export the checkpoint") from None


def load_kept_adapter(directory: Path, adapter: dict, base_model: str | None = None) -> torch.nn.Module:
    """The recorded base model (or `base_model`) with the export's peft adapter applied; a base whose weights
    differ from the sha256 recorded at training is refused in one line."""
    from promptemb.common.optional import require
    from promptemb.encoder.loading import DTYPES, load_pretrained, quantization_kwargs, weights_sha256

    peft = require("peft", "an export that kept its LoRA adapter")
    name = base_model or adapter["base_model"]
    _, base, _ = load_pretrained(name, dtype=DTYPES[adapter.get("dtype") or "float32"],
                                 **quantization_kwargs(adapter.get("quantization")))
    digest = weights_sha256(base)
    if digest != adapter["base_weights_sha256"]:
        raise DataError(f"{directory}: the adapter was trained on base weights sha256 "
                        f"{adapter['base_weights_sha256'][:12]}..., but {name!r} has {digest[:12]}...; pass "
                        "base_model= the model it was trained from")
    return peft.PeftModel.from_pretrained(base, str(directory / adapter["dir"])).eval()


def training_data(checkpoint: dict) -> dict:
    """{"training_data": the corpus files (as named in the config) and their sha256} from a checkpoint's lineage
    record; {} for checkpoints written before lineage was recorded."""
    lineage = checkpoint.get(LINEAGE_KEY)
    if not isinstance(lineage, dict) or "data.files" not in lineage:
        return {}
    return {"training_data": {"files": list(lineage["data.files"] or []),
                              "files_sha256": list(lineage.get("data.files_sha256") or []),
                              **({"mined": lineage["data.mined"]} if lineage.get("data.mined") else {})}}


def matryoshka_record(module) -> dict:
    """{"matryoshka": {"dims", "weights"}} of a module trained with Matryoshka widths (its embeddings' first d
    components are embeddings of their own); {} otherwise."""
    matryoshka = getattr(module, "matryoshka", None)
    return {"matryoshka": matryoshka.describe()} if matryoshka is not None else {}


def unit_rows(embeddings) -> torch.Tensor:
    """float32 CPU rows of unit length ([D] -> [1, D]; a list of rows is stacked)."""
    if isinstance(embeddings, list | tuple):
        embeddings = torch.stack([torch.as_tensor(row) for row in embeddings]) if embeddings else torch.zeros(0, 0)
    rows = torch.atleast_2d(torch.as_tensor(embeddings).detach().cpu().float())
    return torch.nn.functional.normalize(rows, p=2, dim=1)


def read_export_record(directory: Path) -> dict:
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{directory} is not an export directory (no config.json); run export.py first")
    record = export_block(directory)
    if record is None:
        raise ConfigError(f"{directory} has no promptemb block in config.json; it was not written by export.py (a "
                          "plain model opens with PromptEncoder.from_pretrained(DIR, pooler=...))")
    if record.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{directory}: export format {record.get('format_version')} is not {FORMAT_VERSION}")
    return record


def load_encoder(path: str | Path, *, pooler: str | None = None, batch_size: int = 64, device: str | None = None,
                 base_model: str | None = None, verify_weights: bool = True) -> PromptEncoder:
    """A `PromptEncoder` from an export directory or a train.py checkpoint file, on `device` (None / "auto": CUDA
    when present, as sentence-transformers). An export's weight files must match the sha256 recorded at export;
    `verify_weights=False` loads them anyway and records the encoder as unverified (`encoder.source`)."""
    path = Path(path)
    if path.is_dir():
        return PromptEncoder.from_export(path, pooler=pooler, batch_size=batch_size, device=device,
                                         verify_weights=verify_weights, base_model=base_model)
    encoder = PromptEncoder.from_checkpoint(path, base_model=base_model, pooler=pooler, batch_size=batch_size)
    return encoder.to(resolve_device(device))
