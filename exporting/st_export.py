"""The sentence-transformers part of an export: modules.json naming the custom module copied from
`exporting/st_module.py` (standalone: it imports no promptemb code), and config_sentence_transformers.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from promptemb.common.optional import require

MODULE_FILE = "promptemb_st_module.py"
MODULE_CLASS = "promptemb_st_module.PromptEncoderModule"
SOURCE = Path(__file__).with_name("st_module.py")


def write_sentence_transformers_files(directory: Path) -> None:
    import torch
    import transformers

    sentence_transformers = require("sentence_transformers", "an export's sentence-transformers files")
    shutil.copyfile(SOURCE, directory / MODULE_FILE)
    modules = [{"idx": 0, "name": "0", "path": "", "type": MODULE_CLASS}]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    config = {
        "model_type": "SentenceTransformer",
        "__version__": {"sentence_transformers": sentence_transformers.__version__,
                        "transformers": transformers.__version__, "pytorch": torch.__version__},
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "cosine",
    }
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2) + "\n",
                                                                 encoding="utf-8")
