"""The real models `promptemb-models fetch` installs (docs/models.md), where they are fetched: each folder is what its
provenance file says (every written file's sha256), loads with plain transformers without a missing or unexpected
weight, and its tokenizer has the recorded length. Slow; skipped for a model that is not fetched."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

from promptemb.encoder.model_store import MODELS, PROVENANCE_FILE, file_sha256, is_fetched, models_root

pytestmark = pytest.mark.slow

#: (AutoModel class that loads every weight of the folder, what from_pretrained must build, len(tokenizer))
EXPECTED = {"smollm2-135m-instruct": (AutoModelForCausalLM, "LlamaForCausalLM", 49152),
            "splade-tiny": (AutoModelForMaskedLM, "BertForMaskedLM", 30522),
            "all-mpnet-base-v2": (AutoModel, "MPNetModel", 30527)}


def fetched(name: str):
    folder = models_root() / name
    if not is_fetched(folder):
        pytest.skip(f"model:{name} is not fetched in {models_root()} (promptemb-models fetch {name})")
    return folder


@pytest.mark.parametrize("name", list(MODELS))
def test_a_fetched_model_is_what_its_provenance_says_and_loads(name):
    folder = fetched(name)
    record = json.loads((folder / PROVENANCE_FILE).read_text())
    written = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} - {PROVENANCE_FILE}
    assert set(record["output_sha256"]) == written
    for relative, sha256 in record["output_sha256"].items():
        assert file_sha256(folder / relative) == sha256, relative
    assert [f["sha256"] for f in record["files_verified"]] == [f.sha256 for f in MODELS[name].files]
    auto, architecture, length = EXPECTED[name]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == record["tokenizer_length"] == length
    model, loading = auto.from_pretrained(folder, output_loading_info=True)
    assert type(model).__name__ == architecture
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    with torch.no_grad():
        out = model(**tokenizer(["a man is playing a guitar ."], return_tensors="pt"), output_hidden_states=True)
    assert torch.isfinite(out.hidden_states[-1]).all()
