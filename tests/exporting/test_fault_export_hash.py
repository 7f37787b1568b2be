"""Fault injection, exports: an export's weight files are checked against the sha256 recorded when it was written.
Another model's weights swapped in, a weight file truncated, removed or added: evaluate.py and load_encoder refuse in
one line and change nothing; `allow_unverified_weights=true` / `verify_weights=False` score it anyway, recorded as
an unverified model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from promptemb.common.errors import DataError
from promptemb.data.checksums import sha256_file
from promptemb.exporting.model_card import model_card
from promptemb.exporting.runner import write_model_files
from promptemb.exporting.st_layout import choose_layout
from promptemb.inference.prompt_encoder import PromptEncoder, load_encoder
from promptemb.lightning_modules.promptbert import PromptBERTSup
from tests.faults import listing, run_entry
from tests.helpers import assert_one_line_error, save_tiny_bert, tree_digest

SENTENCES = ["a man is playing a guitar .", "stocks fell on monday ."]


def export_of(model_dir: Path, out: Path, head: bool = True) -> Path:
    module = PromptBERTSup(str(model_dir)).eval()  # the supervised recipe has a head: a second weight file
    encoder = PromptEncoder(module.transformer, module.tokenizer, template=module.eval_template.text,
                            head=module.head if head else None, max_length=module.max_length)
    out.mkdir(parents=True)
    write_model_files(encoder, out, choose_layout(encoder))
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> tuple[Path, Path]:
    """Two exports of differently initialised tiny BERTs (the second one's weights are "another model's")."""
    root = tmp_path_factory.mktemp("exports")
    first = export_of(save_tiny_bert(root / "bert0", seed=0), root / "export0")
    other = export_of(save_tiny_bert(root / "bert1", seed=1), root / "export1")
    return first, other


def damaged_copy(exports, tmp_path: Path, fault: str) -> Path:
    first, other = exports
    damaged = shutil.copytree(first, tmp_path / "export")
    weights = damaged / "model.safetensors"
    if fault == "other_model":
        shutil.copyfile(other / "model.safetensors", weights)
    elif fault == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif fault == "flipped_byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif fault == "head_removed":
        (damaged / "promptemb_head.safetensors").unlink()
    elif fault == "extra_weights":
        shutil.copyfile(other / "model.safetensors", damaged / "pytorch_model.safetensors")
    return damaged


FAULTS = {"other_model": r"model\.safetensors has sha256 \w+\.\.\., not the \w+\.\.\. exported",
          "truncated": r"model\.safetensors has sha256", "flipped_byte": r"model\.safetensors has sha256",
          "head_removed": r"promptemb_head\.safetensors is missing",
          "extra_weights": r"pytorch_model\.safetensors was not part of the export"}


def test_export_records_every_weight_file_and_the_card_lists_them(exports):
    first, _ = exports
    record = json.loads((first / "config.json").read_text())["promptemb"]
    assert record["weights_sha256"] == {name: sha256_file(first / name)
                                        for name in ("model.safetensors", "promptemb_head.safetensors")}
    card = model_card(record, None, None)
    for name, digest in record["weights_sha256"].items():
        assert f"`{name}`: `{digest}`" in card
    assert load_encoder(first).source["weights_verified"] is True


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_load_encoder_refuses_weights_that_are_not_the_export(exports, tmp_path, fault):
    damaged = damaged_copy(exports, tmp_path, fault)
    before = tree_digest(damaged)
    with pytest.raises(DataError, match=FAULTS[fault]) as refused:
        load_encoder(damaged)
    assert "\n" not in str(refused.value) and "allow_unverified_weights=true" in str(refused.value)
    assert tree_digest(damaged) == before
    if fault in ("other_model", "flipped_byte", "extra_weights"):  # loadable files: used on request, as unverified
        unverified = load_encoder(damaged, verify_weights=False)
        assert unverified.source["weights_verified"] is False
        assert unverified.encode(SENTENCES).shape[0] == 2
    elif fault == "truncated":  # asked to load it anyway: it cannot be, and that is one line too
        with pytest.raises(DataError, match=r"the model weights do not load \(SafetensorError: "):
            load_encoder(damaged, verify_weights=False)


def test_an_export_without_recorded_hashes_still_loads_marked_as_such(exports, tmp_path):
    legacy = shutil.copytree(exports[0], tmp_path / "legacy")
    config = json.loads((legacy / "config.json").read_text())
    del config["promptemb"]["weights_sha256"]
    (legacy / "config.json").write_text(json.dumps(config))
    assert load_encoder(legacy).source["weights_verified"] is None


def evaluate_export(export: Path, mini_data, out: Path, *extra: str):
    root, registry = mini_data
    return run_entry("evaluate.py", f"backbone.name_or_path={export}", "tasks=[MINI-B]", f"task_registry={registry}",
                     "progress=false", "backbone.device=cpu", f"output_dir={out}", *extra, data_root=root,
                     cwd=out.parent)


def test_evaluate_refuses_swapped_weights(exports, mini_data, tmp_path):
    damaged = damaged_copy(exports, tmp_path, "other_model")
    before, everything = tree_digest(damaged), listing(tmp_path)
    refused = evaluate_export(damaged, mini_data, tmp_path / "scores")
    assert_one_line_error(refused, r"the weights are not the ones exported \(model\.safetensors has sha256")
    assert tree_digest(damaged) == before and listing(tmp_path) == everything  # nothing changed, nothing left


@pytest.mark.slow
def test_evaluate_scores_swapped_weights_as_unverified_on_request(exports, mini_data, tmp_path):
    damaged = damaged_copy(exports, tmp_path, "other_model")
    before = tree_digest(damaged)
    scored = evaluate_export(damaged, mini_data, tmp_path / "scores", "allow_unverified_weights=true")
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "UNVERIFIED" in scored.stdout + scored.stderr
    source = json.loads((tmp_path / "scores" / "results.json").read_text())["provenance"]["model"]["source"]
    assert source["weights_verified"] is False and "model.safetensors has sha256" in source["weights_note"]
    assert tree_digest(damaged) == before
