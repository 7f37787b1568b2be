"""The sentence-transformers part of an export, in one of two layouts:

* native: sentence-transformers' own modules (Transformer + Pooling [+ Dense] [+ Normalize]), written as the installed
  sentence-transformers writes them, plus `sentence_bert_config.json` (max_seq_length) and the prompts of
  `config_sentence_transformers.json`. `SentenceTransformer(DIR)` loads it without `trust_remote_code`, and its
  ONNX/OpenVINO backends, `encode_query`/`encode_document` and MTEB's model metadata work as for any native model.
* custom: modules.json naming the module copied from `exporting/st_module.py` (standalone: it imports no promptemb
  code), loaded with `trust_remote_code=True`.

Which one an export gets is decided in exporting/st_layout.py; this module only writes what it is given.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from promptemb.common.optional import require

MODULE_FILE = "promptemb_st_module.py"
MODULE_CLASS = "promptemb_st_module.PromptEncoderModule"
SOURCE = Path(__file__).with_name("st_module.py")
#: the prompt names a native export with a prefix fills (the same text for both: an export has one template);
#: `query` is also the default prompt, so plain `encode` prepends it as well
PROMPT_NAMES = ("query", "document")


@dataclass(frozen=True)
class DenseLayer:
    """sentence-transformers' Dense module: activation(W x + b) on the sentence embedding."""

    weight: torch.Tensor  # [out, in]
    bias: torch.Tensor | None
    activation: torch.nn.Module  # an nn.Module (sentence-transformers restores it from its class name)


@dataclass(frozen=True)
class NativeModules:
    """Standard modules after the Transformer: Pooling in `pooling_mode` (sentence-transformers' names: mean, cls,
    lasttoken, weightedmean, ...) over every token the Transformer sees, `prompt` included; then an optional Dense
    and Normalize. The Transformer truncates `prompt + text` to `max_seq_length` tokens, special tokens included."""

    pooling_mode: str
    max_seq_length: int
    prompt: str = ""
    dense: DenseLayer | None = None
    normalize: bool = False


def write_sentence_transformers_files(directory: Path, native: NativeModules | None, hidden_size: int) -> None:
    """Into `directory`, which holds (or will hold) the Hugging Face model files: the native modules (`native`) or
    the custom module (None). `hidden_size`: the transformer's output width."""
    require("sentence_transformers", "an export's sentence-transformers files")
    if native is None:
        shutil.copyfile(SOURCE, directory / MODULE_FILE)
        modules = [{"idx": 0, "name": "0", "path": "", "type": MODULE_CLASS}]
    else:
        modules = write_native_modules(directory, native, hidden_size)
    (directory / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    prompt = native.prompt if native is not None else ""
    write_model_config(directory, {name: prompt for name in PROMPT_NAMES} if prompt else {},
                       PROMPT_NAMES[0] if prompt else None)


def write_native_modules(directory: Path, native: NativeModules, hidden_size: int) -> list[dict]:
    """The module folders and `sentence_bert_config.json`; returns modules.json's entries. The Transformer is the
    Hugging Face directory itself (path ""), so `load_encoder` and `AutoModel` read the same files."""
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    config = {"max_seq_length": native.max_seq_length, "do_lower_case": False}
    (directory / "sentence_bert_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    entries = [module_entry(0, "", Transformer)]
    stack = [Pooling(hidden_size, pooling_mode=native.pooling_mode)]
    if native.dense is not None:
        dense = native.dense
        layer = Dense(dense.weight.shape[1], dense.weight.shape[0], bias=dense.bias is not None,
                             activation_function=dense.activation)
        with torch.no_grad():
            layer.linear.weight.copy_(dense.weight)
            if dense.bias is not None:
                layer.linear.bias.copy_(dense.bias)
        stack.append(layer)
    if native.normalize:
        stack.append(Normalize())
    for index, module in enumerate(stack, start=1):
        path = f"{index}_{type(module).__name__}"
        (directory / path).mkdir()
        module.save(str(directory / path))
        entries.append(module_entry(index, path, type(module)))
    return entries


def module_entry(index: int, path: str, module_class: type) -> dict:
    """A modules.json entry naming the class as sentence-transformers itself does (its module path)."""
    return {"idx": index, "name": str(index), "path": path,
            "type": f"{module_class.__module__}.{module_class.__qualname__}"}


def write_model_config(directory: Path, prompts: dict[str, str], default_prompt_name: str | None) -> None:
    import transformers

    sentence_transformers = require("sentence_transformers", "an export's sentence-transformers files")
    config = {
        "model_type": "SentenceTransformer",
        "__version__": {"sentence_transformers": sentence_transformers.__version__,
                        "transformers": transformers.__version__, "pytorch": torch.__version__},
        "prompts": prompts,
        "default_prompt_name": default_prompt_name,
        "similarity_fn_name": "cosine",
    }
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2) + "\n",
                                                                 encoding="utf-8")
