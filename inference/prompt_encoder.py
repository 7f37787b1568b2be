"""`load_encoder(path).encode(sentences)`: a trained prompt encoder with its recorded template and pooler.

Loads a train.py checkpoint (.ckpt) or an export directory (export.py) and embeds with the framework's own
`Encoder` + poolers, i.e. exactly the code the checkpoint was scored with. `record()` is what an export writes into
the `promptemb` block of its config.json; `from_export` reads it back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.version import framework_version
from promptemb.data.checksums import sha256_file
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.model import Encoder, resolve_device
from promptemb.encoder.template import Template
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from promptemb.lightning_modules.heads import MLMTransformHead, MLPHead
from promptemb.lightning_modules.soft_template import SoftTemplate
from promptemb.poolers.base import Pooler
from promptemb.poolers.mask import MaskPooler
from promptemb.poolers.mean import MeanPooler

FORMAT_VERSION = 1
POOLERS = ("mask", "avg")
HEAD_FILE = "promptemb_head.safetensors"
SOFT_TEMPLATE_FILE = "promptemb_soft_template.safetensors"
#: Files of an export that hold weights; each one's sha256 is recorded in the `promptemb` block at export.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")
UNVERIFIED_HINT = ("pass allow_unverified_weights=true (evaluate.py) or verify_weights=False (load_encoder) to use "
                   "it anyway, recorded as an unverified model")


def weight_files(directory: Path) -> list[Path]:
    return sorted(path for path in Path(directory).rglob("*") if path.is_file() and path.suffix in WEIGHT_SUFFIXES
                  and not path.name.startswith("."))


def weights_sha256(directory: Path) -> dict[str, str]:
    """sha256 of every weight file of an export directory, by path relative to it."""
    return {path.relative_to(directory).as_posix(): sha256_file(path, cached=False) for path in weight_files(directory)}


def weight_mismatches(directory: Path, recorded: dict[str, str]) -> list[str]:
    """How the weight files of `directory` differ from the sha256 recorded at export, one phrase per file."""
    actual = weights_sha256(directory)
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
        template: str,
        sentence_rule: str = "none",
        pooler: str = "mask",
        layer: int = -1,
        denoise: bool = False,
        head: torch.nn.Module | None = None,
        head_after_denoise: bool = False,
        soft_template: SoftTemplate | None = None,
        max_length: int | None = None,
        max_sentence_tokens: int | None = None,
        batch_size: int = 64,
        source: dict | None = None,
    ):
        if pooler not in POOLERS:
            raise ConfigError(f"unknown export pooler {pooler!r}; valid: {', '.join(POOLERS)}")
        self.template = Template(template)
        self.sentence_rule = sentence_rule
        self.pooler_name = pooler
        self.layer, self.denoise, self.head = layer, bool(denoise) and pooler == "mask", head
        self.head_after_denoise = head_after_denoise
        self.soft_template = soft_template
        self.source = dict(source or {})
        self.encoder = Encoder.from_model(transformer, tokenizer, name=self.source.get("base_model", "exported"),
                                          batch_size=batch_size, max_length=max_length, input_embedder=soft_template)
        self.builder = self.encoder.input_builder(InputForm(self.template, sentence_rule, max_sentence_tokens))
        self.max_sentence_tokens = self.builder.max_sentence_tokens
        if pooler == "mask":
            self.pooler: Pooler = MaskPooler("mask", layer=layer, denoise=self.denoise, head=head,
                                             head_after_denoise=head_after_denoise)
        else:
            self.pooler = MeanPooler("avg", layers=(layer,), templated=True)
        self.encoder.check_poolers([self.pooler], self.template)

    @property
    def transformer(self) -> torch.nn.Module:
        return self.encoder.transformer

    @property
    def tokenizer(self):
        return self.encoder.tokenizer

    def to(self, device: str | torch.device) -> PromptEncoder:
        for part in (self.encoder.transformer, self.head, self.soft_template):
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
            },
            "soft_template": None if self.soft_template is None else {"file": SOFT_TEMPLATE_FILE,
                                                                      "size": len(self.soft_template.vectors)},
            "source": self.source,
        }

    # -- constructors ---------------------------------------------------------------------------------------------

    @classmethod
    def from_module(cls, module, *, pooler: str | None = None, denoise: bool | None = None,
                    batch_size: int = 64, source: dict | None = None) -> PromptEncoder:
        """The module's primary evaluation pooler (its [MASK] pooler, denoised and with a head as the module scores
        checkpoints), or `pooler="avg"`; `denoise` overrides the [MASK] pooler's denoising."""
        primary = module.eval_poolers()[0]
        if not isinstance(primary, MaskPooler):
            raise ConfigError(f"{type(module).__name__}'s primary evaluation pooler is not a [MASK] pooler")
        name = pooler or "mask"
        return cls(
            module.transformer, module.tokenizer,
            template=module.eval_template.text, sentence_rule=module.hparams.sentence_rule, pooler=name,
            layer=primary.layer, denoise=primary.denoise if denoise is None else denoise,
            head=primary.head if name == "mask" else None, head_after_denoise=primary.head_after_denoise,
            soft_template=getattr(module, "soft_template", None),
            max_length=module.max_length, max_sentence_tokens=None, batch_size=batch_size,
            source={"module": f"{type(module).__module__}.{type(module).__qualname__}",
                    "base_model": module.hparams.model_name_or_path, **(source or {})},
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, base_model: str | None = None, **kwargs) -> PromptEncoder:
        loaded = load_module_checkpoint(path, base_model)
        source = {"checkpoint": str(Path(path).resolve()), "checkpoint_sha256": loaded.sha256,
                  "global_step": loaded.global_step}
        return cls.from_module(loaded.module, source=source, **kwargs)

    @classmethod
    def from_export(cls, directory: str | Path, *, pooler: str | None = None, batch_size: int = 64,
                    device: str | None = None, verify_weights: bool = True) -> PromptEncoder:
        """`device` None / "auto": CUDA when present. The weight files are checked against the sha256 recorded at
        export first (`verify_weights=False`: loaded anyway, recorded as unverified in `source`)."""
        from safetensors.torch import load_file
        from transformers import AutoModel, AutoTokenizer

        directory = Path(directory)
        device = resolve_device(device)
        record = read_export_record(directory)
        verification = verify_export_weights(directory, record, verify_weights)
        try:
            transformer = AutoModel.from_pretrained(directory).to(device).eval()
        except Exception as err:  # unverified weights (or none recorded) that do not even load: safetensors/torch
            raise DataError(f"{directory}: the model weights do not load ({type(err).__name__}: "
                            f"{(str(err).splitlines() or [''])[0]}); re-export the checkpoint") from None
        tokenizer = AutoTokenizer.from_pretrained(directory)
        spec = record["pooler"]
        head, head_after_denoise = None, False
        if spec.get("head") and (pooler or spec["name"]) == "mask":
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
        encoder = cls(transformer, tokenizer, template=record["template"], sentence_rule=record["sentence_rule"],
                      pooler=pooler or spec["name"], layer=spec["layer"], denoise=spec["denoise"], head=head,
                      head_after_denoise=head_after_denoise,
                      soft_template=soft, max_length=record["max_length"],
                      max_sentence_tokens=record["max_sentence_tokens"], batch_size=batch_size,
                      source={**record.get("source", {}), "export_dir": str(directory.resolve()), **verification})
        if encoder.builder.prefix_ids != record["prefix_ids"] or encoder.builder.suffix_ids != record["suffix_ids"]:
            raise DataError(f"{directory}: the tokenizer does not reproduce the recorded template ids")
        return encoder


def unit_rows(embeddings) -> torch.Tensor:
    """float32 CPU rows of unit length ([D] -> [1, D]; a list of rows is stacked)."""
    if isinstance(embeddings, list | tuple):
        embeddings = torch.stack([torch.as_tensor(row) for row in embeddings]) if embeddings else torch.zeros(0, 0)
    rows = torch.atleast_2d(torch.as_tensor(embeddings).detach().cpu().float())
    return torch.nn.functional.normalize(rows, p=2, dim=1)


def export_block(directory: Path) -> dict | None:
    """The `promptemb` block of `directory/config.json`; None without one (no config.json, or not written by
    export.py). Invalid JSON is a DataError."""
    config = directory / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{config} is not valid JSON ({err})") from None
    record = data.get("promptemb") if isinstance(data, dict) else None
    return record if isinstance(record, dict) else None


def read_export_record(directory: Path) -> dict:
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{directory} is not an export directory (no config.json); run export.py first")
    record = export_block(directory)
    if record is None:
        raise ConfigError(f"{directory} has no promptemb block in config.json; it was not written by export.py")
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
                                         verify_weights=verify_weights)
    encoder = PromptEncoder.from_checkpoint(path, base_model=base_model, pooler=pooler, batch_size=batch_size)
    return encoder.to(resolve_device(device))
