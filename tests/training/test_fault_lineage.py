"""Fault injection, lineage: a resume whose data, batch size, sampler, backbone, tokenizer, template or recipe differ
from what its checkpoint was trained with is refused with one line naming each changed item (exit 2, no traceback),
before anything is written: the run folder stays byte-identical. Hydra's `.hydra/config.yaml` and the finished run's
`status.json` included. Each checkpoint records the lineage it is checked against."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.lightning_modules.checkpoint import LINEAGE_KEY
from promptemb.training.lineage import check_lineage, lineage_changes
from tests.helpers import assert_one_line_error, error_starting, save_tiny_bert
from tests.run_faults import fast_overrides, snapshot, train_py


def resume_args(run: dict, *extra: str, corpus=None, model=None) -> list[str]:
    out = run["out"]
    base = fast_overrides(model or run["overrides"][1].split("=", 1)[1], run["overrides"][2].split("=", 1)[1], out,
                          corpus or run["corpus"])
    return [*base, "trainer.max_steps=6", f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}", *extra]


def test_every_checkpoint_records_its_lineage(finished_run):
    saved = torch.load(finished_run["out"] / "checkpoints" / "last.ckpt", weights_only=True)
    lineage = saved[LINEAGE_KEY]
    assert lineage["recipe"] == "promptemb.lightning_modules.promptbert.PromptBERTUnsup"
    assert lineage["data.batch_size"] == 4 and lineage["data.max_examples"] == 24 and lineage["data.seed"] == 42
    assert len(lineage["data.files_sha256"]) == 1 and len(lineage["backbone_weights_sha256"]) == 64
    assert lineage["tokenizer_sha256"] and len(lineage["model.templates"]) == 2


def test_best_checkpoints_hold_what_scoring_needs_and_last_what_resuming_needs(finished_run):
    """The best checkpoints leave out the optimizer state (AdamW: twice the weights) and keep everything scoring and
    export read (weights, hyper-parameters, lineage, step); last.ckpt keeps the optimizer state too."""
    folder = finished_run["out"] / "checkpoints"
    last = torch.load(folder / "last.ckpt", weights_only=True)
    best = [path for path in folder.glob("*.ckpt") if path.name != "last.ckpt"]
    assert best and "optimizer_states" in last
    for path in best:
        saved = torch.load(path, weights_only=True)
        assert "optimizer_states" not in saved
        assert {"state_dict", "hyper_parameters", LINEAGE_KEY, "global_step", "callbacks"} <= set(saved)
        assert saved[LINEAGE_KEY] == last[LINEAGE_KEY]
        assert path.stat().st_size < (folder / "last.ckpt").stat().st_size


def test_resuming_from_a_best_checkpoint_is_refused_and_changes_nothing(finished_run):
    best = next(path for path in (finished_run["out"] / "checkpoints").glob("*.ckpt") if path.name != "last.ckpt")
    before = snapshot(finished_run["out"])
    args = [arg for arg in resume_args(finished_run) if not arg.startswith("ckpt_path=")]
    proc = train_py(*args, f"ckpt_path={best}")
    line = assert_one_line_error(proc, error_starting(f"cannot resume from {best}: it holds the weights without the "
                                                      "optimizer state"))
    assert line.endswith(f"resume from {best.parent / 'last.ckpt'} (ckpt_path=last)")
    assert snapshot(finished_run["out"]) == before


def test_shuffled_corpus_and_other_batch_size_are_refused_and_change_nothing(finished_run, tmp_path):
    """Same line count, other order: only a content fingerprint tells; the batch size moves the data position."""
    lines = finished_run["corpus"].read_text(encoding="utf-8").splitlines(keepends=True)
    random.Random(0).shuffle(lines)
    shuffled = tmp_path / "corpus.txt"
    shuffled.write_text("".join(lines), encoding="utf-8")
    before = snapshot(finished_run["out"])
    proc = train_py(*resume_args(finished_run, "data.batch_size=8", corpus=shuffled))
    last = finished_run["out"] / "checkpoints" / "last.ckpt"
    line = assert_one_line_error(proc, error_starting(f"cannot resume from {last}"))
    assert f"training data {shuffled}: content changed (sha256 " in line
    assert "data.batch_size 4 -> 8" in line and line.count(";") == 2  # exactly two changed items named
    assert snapshot(finished_run["out"]) == before


@pytest.mark.slow
@pytest.mark.parametrize("change, named", [
    (["model=optiprompt"], "recipe (model._target_) promptemb.lightning_modules.promptbert.PromptBERTUnsup -> "
                           "promptemb.lightning_modules.optiprompt.OptiPrompt"),
    (["template=word_pair"], "model.templates ["),
    (["data.group_by_length=true"], "data.group_by_length False -> True"),
    (["seed=7"], "data.seed 42 -> 7"),
])
def test_other_recipe_template_or_sampler_is_refused_in_one_line(change, named, finished_run):
    before = snapshot(finished_run["out"])
    proc = train_py(*resume_args(finished_run, *change))
    assert named in assert_one_line_error(proc, error_starting("cannot resume from "))
    assert snapshot(finished_run["out"]) == before


@pytest.mark.slow
def test_other_backbone_is_refused_not_a_load_state_dict_traceback(finished_run, tmp_path):
    other = save_tiny_bert(tmp_path / "other", seed=1, layers=2)
    before = snapshot(finished_run["out"])
    proc = train_py(*resume_args(finished_run, model=other))
    assert "backbone weights (sha256) " in assert_one_line_error(proc, error_starting("cannot resume from "))
    assert snapshot(finished_run["out"]) == before


@pytest.mark.slow
def test_moved_backbone_and_corpus_with_the_same_content_resume(finished_run, tmp_path):
    """Paths are not lineage: the same bytes elsewhere are the same run."""
    run = tmp_path / "run"
    shutil.copytree(finished_run["out"], run)
    model = tmp_path / "model"
    shutil.copytree(finished_run["overrides"][1].split("=", 1)[1], model)
    corpus = tmp_path / "corpus.txt"
    shutil.copyfile(finished_run["corpus"], corpus)
    proc = train_py(*fast_overrides(model, finished_run["overrides"][2].split("=", 1)[1], run, corpus),
                    "trainer.max_steps=6", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6


def test_lineage_changes_name_each_item_and_compare_content_not_names():
    saved = {"recipe": "R", "backbone": "/a/model", "backbone_weights_sha256": "1" * 64, "data.files": ["x.txt"],
             "data.files_sha256": ["2" * 64], "data.batch_size": 64, "data.seed": 1}
    same_bytes_elsewhere = {**saved, "backbone": "/b/model", "data.files": ["/elsewhere/x.txt"]}
    assert lineage_changes(saved, same_bytes_elsewhere) == []
    changed = {**saved, "recipe": "S", "data.files_sha256": ["3" * 64], "data.batch_size": 128, "world": 2}
    assert lineage_changes(saved, changed) == [
        "recipe (model._target_) R -> S", "training data x.txt: content changed (sha256 222222222222 -> 333333333333)",
        "data.batch_size 64 -> 128"]


def test_a_checkpoint_without_a_lineage_record_is_refused(tmp_path):
    """A resume is checked against the lineage its checkpoint records; one that records none cannot be checked."""
    with pytest.raises(ConfigError, match=r"records no lineage .* to check the resume against; pass a checkpoint "
                                          r"written by train\.py"):
        check_lineage(tmp_path / "old.ckpt", {"state_dict": {}, "hyper_parameters": {}}, {"recipe": "R"})
