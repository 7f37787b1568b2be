"""evaluate.py on what training leaves behind: a `.ckpt`, a run folder (its best checkpoint) and an export folder,
each scored exactly as the training callback scored that checkpoint (an OptiPrompt export keeps its soft prompt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from promptemb.common.errors import ConfigError
from promptemb.common.hydra_bridge import plain
from promptemb.encoder.sources import source_kind
from promptemb.evaluation.settings import EncodeSettings, EvaluateSettings
from promptemb.inference.model_sources import best_checkpoint
from promptemb.inference.runner import run
from promptemb.training.runner import train
from tests.conftest import REPO
from tests.evaluation.test_evaluate_cli import ENCODE_TOL, evaluate
from tests.helpers import assert_close_scaled, assert_one_line_error
from tests.training.test_train import checked

WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
TASK = "STSBenchmark"


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        return compose(name, overrides=overrides)


@pytest.fixture(scope="module")
def optiprompt_run(tiny_bert, real_data_root, tmp_path_factory) -> Path:
    """A 4-step OptiPrompt run on the tiny BERT: dev-scored at steps 2 and 4, best checkpoint scored on STS-B test
    (results.json) and exported (train.py's export hook)."""
    out = tmp_path_factory.mktemp("optiprompt") / "run"
    train(checked(compose_config("train", [
        "experiment=quickstart_optiprompt", f"backbone.name_or_path={tiny_bert}", f"data_root={real_data_root}",
        f"output_dir={out}", "trainer.precision=32-true", "trainer.max_steps=4", "eval_every_n_steps=2",
        "optimizer.lr=0.05", "data.batch_size=4", "data.num_workers=0",
        f"callbacks.sts_evaluation.final_tasks=[{TASK}]", "data.download=null",
        f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64", f"export_dir={out / 'export'}"])))
    return out


def evaluate_in_process(model: Path, data_root: Path, out: Path, *overrides: str) -> dict:
    """evaluate.py in this process: its score command, or with `mode=encode` its encode command (encode.yaml)."""
    encode = "mode=encode" in overrides
    scoring = [] if encode else [f"tasks=[{TASK}]", "poolers=[mean]"]
    cfg = compose_config("encode" if encode else "eval", [
        f"backbone.name_or_path={model}", f"data_root={data_root}", f"output_dir={out}", *scoring, "progress=false",
        "backbone.device=cpu", *overrides])
    return run((EncodeSettings if encode else EvaluateSettings).model_validate(plain(cfg)))


@pytest.mark.slow
def test_checkpoint_run_folder_and_export_score_as_training_did(optiprompt_run, real_data_root, tmp_path):
    trained = json.loads((optiprompt_run / "results.json").read_text())
    best = Path(trained["provenance"]["model"]["checkpoint"])
    assert best.parent == optiprompt_run / "checkpoints" and best.name != "last.ckpt"
    assert best_checkpoint(optiprompt_run) == best
    assert [source_kind(str(p)) for p in (best, optiprompt_run, optiprompt_run / "export")] == [
        "checkpoint", "run", "export"]
    expected = trained["scores"]

    from_ckpt = evaluate_in_process(best, real_data_root, tmp_path / "ckpt")
    from_run = evaluate_in_process(optiprompt_run, real_data_root, tmp_path / "run")
    from_export = evaluate_in_process(optiprompt_run / "export", real_data_root, tmp_path / "export")
    for results in (from_ckpt, from_run):  # the module's own poolers, then the configured training-free one
        assert list(results["scores"]) == ["mask", "avg", "mean"]
        for pooler in ("mask", "avg"):
            assert results["scores"][pooler][TASK] == pytest.approx(expected[pooler][TASK], abs=1e-9)
        source = results["provenance"]["model"]["source"]
        assert source["checkpoint"] == str(best) and source["module"].endswith("OptiPrompt")
        assert results["provenance"]["input"]["template"] == trained["provenance"]["input"]["template"]
    assert from_run["provenance"]["model"]["source"]["run_dir"] == str(optiprompt_run)
    # the export holds one pooler ([MASK] with the learned soft template): the callback's [MASK] score
    assert list(from_export["scores"]) == ["mask", "mean"]
    assert from_export["scores"]["mask"][TASK] == pytest.approx(expected["mask"][TASK], abs=1e-9)
    record = from_export["provenance"]["model"]["source"]["record"]
    assert record["soft_template"] is not None and record["template"] == trained["provenance"]["input"]["template"]
    # the soft prompt matters: the manual template on the same (frozen) encoder scores differently
    manual = evaluate_in_process(Path(trained["provenance"]["model"]["name_or_path"]), real_data_root,
                                 tmp_path / "manual", "poolers=[mask]", f"template.text='{record['template']}'")
    assert manual["scores"]["mask"][TASK] != pytest.approx(expected["mask"][TASK], abs=1e-3)


@pytest.mark.slow
def test_evaluate_py_on_a_checkpoint_file(optiprompt_run, real_data_root, tmp_path):
    best = best_checkpoint(optiprompt_run)
    out = tmp_path / "cli"
    proc = evaluate(f"backbone.name_or_path={best}", f"tasks=[{TASK}]", "poolers=[mask]", f"output_dir={out}",
                    "backbone.device=cpu", data_root=real_data_root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = json.loads((optiprompt_run / "results.json").read_text())["scores"]
    scores = json.loads((out / "results.json").read_text())["scores"]
    assert list(scores) == ["mask", "avg"]  # `mask` names the checkpoint's own [MASK] pooler (soft template)
    assert scores["mask"][TASK] == pytest.approx(expected["mask"][TASK], abs=1e-9)


def test_a_different_template_for_a_trained_model_is_one_line_error(optiprompt_run, real_data_root, tmp_path):
    out = tmp_path / "bad"
    proc = evaluate(f"backbone.name_or_path={optiprompt_run / 'export'}", f"tasks=[{TASK}]", f"output_dir={out}",
                    "template.text='This means [X] [MASK] .'", data_root=real_data_root)
    assert_one_line_error(proc, r"was trained with template .*drop the template=", out)


def test_run_folder_without_checkpoints_is_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match="no scored checkpoint"):
        best_checkpoint(tmp_path)


def test_encode_mode_on_an_export_uses_its_pooler(optiprompt_run, real_data_root, tmp_path):
    import numpy as np

    from promptemb.inference import load_encoder

    lines = ["a man plays a guitar .", "two dogs run in a field", "short"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    export = optiprompt_run / "export"
    embeddings = evaluate_in_process(export, real_data_root, tmp_path / "unused", "mode=encode", "pooler=mask",
                                     f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.npy'}")
    expected = load_encoder(export, device="cpu").encode(lines)
    assert_close_scaled(embeddings, expected, ENCODE_TOL)
    assert np.array_equal(np.load(tmp_path / "out.npy"), embeddings)


def test_a_backbone_key_a_trained_model_keeps_is_one_line_error(optiprompt_run, real_data_root, tmp_path):
    """A trained model keeps the token limit, dtype, revision and padding it was trained with: an explicit override
    of one is refused before the model is opened, instead of being accepted and ignored."""
    out = tmp_path / "bad"
    proc = evaluate(f"backbone.name_or_path={optiprompt_run / 'export'}", f"tasks=[{TASK}]", f"output_dir={out}",
                    "backbone.max_length=64", data_root=real_data_root)
    assert_one_line_error(proc, r"^error: backbone\.max_length= does not apply to a trained model \(export\): it is "
                                r"scored with the max_length it was trained or exported with; drop "
                                r"backbone\.max_length=$", out)


def test_arguments_for_a_trained_models_own_pooler_are_refused(optiprompt_run, real_data_root, tmp_path):
    """`mask` on a trained model is its own pooler, scored as trained: `+pooler_args.mask.layer=-2` would be
    ignored, so it is refused in one line."""
    with pytest.raises(ConfigError, match=r"^pooler_args\.mask would be ignored: mask is the model's own pooler, "
                                          r"scored as the model was trained; drop the arguments$"):
        evaluate_in_process(optiprompt_run / "export", real_data_root, tmp_path / "out", "poolers=[mask]",
                            "+pooler_args.mask.layer=-2")


def test_a_trained_model_runs_with_the_backbone_inference_options(optiprompt_run, real_data_root, tmp_path):
    """`backbone.parallel_batches` / `backbone.onednn_linears` apply to a trained model too (they were ignored):
    recorded in the provenance, the score equal to training's to float rounding."""
    expected = json.loads((optiprompt_run / "results.json").read_text())["scores"]["mask"][TASK]
    for model in (optiprompt_run / "export", optiprompt_run):
        out = tmp_path / model.name
        results = evaluate_in_process(model, real_data_root, out, "backbone.parallel_batches=2",
                                      "backbone.onednn_linears=true")
        assert results["provenance"]["model"]["linear_kernels"] == "onednn_packed"
        assert results["scores"]["mask"][TASK] == pytest.approx(expected, abs=1e-4)
