"""examples/simcse_recipe.py, used as a user would use it: copied with its configs into a folder outside the package,
it trains 2 steps, resumes, is scored by the training callback, by `evaluate.py` on its run folder and exported by
`export.py`, and the export reloaded in sentence-transformers gives the embeddings evaluate.py encodes. A checkpoint
of it without `imports=`, a module that takes a built-in's name and a module that does not import are refused in
one line each, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.helpers import assert_close_scaled, assert_one_line_error
from tests.run_faults import WIKI_SAMPLE

EXAMPLES = REPO / "examples"


def command(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("PYTHONPATH", None)  # the user's folder is found as the current directory, not through PYTHONPATH
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The user's own folder: the recipe module and its configs, nothing of promptemb."""
    folder = tmp_path_factory.mktemp("user")
    shutil.copy(EXAMPLES / "simcse_recipe.py", folder)
    shutil.copytree(EXAMPLES / "configs", folder / "configs")
    return folder


def training(work: Path, model: Path, root: Path, run: Path, *extra: str) -> list[str]:
    return [f"hydra.searchpath=[file://{work / 'configs'}]", "experiment=quickstart_simcse",
            f"backbone.name_or_path={model}", f"data_root={root}", f"output_dir={run}", "data.batch_size=4",
            "data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=16", "data.num_workers=0",
            "eval_every_n_steps=1", "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", *extra]


@pytest.fixture(scope="module")
def trained(work, tiny_bert, real_data_root) -> Path:
    run = work / "runs" / "simcse"
    first = command("train.py", *training(work, tiny_bert, real_data_root, run, "trainer.max_steps=2"), cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = command("train.py", *training(work, tiny_bert, real_data_root, run, "trainer.max_steps=3",
                                            f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"), cwd=work)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return run


def test_a_users_recipe_trains_resumes_and_is_scored_by_the_callback(trained):
    checkpoint = json.loads((trained / "status.json").read_text())
    assert checkpoint["status"] == "completed"
    import torch

    last = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 3 and last["promptemb_recipe"]["name"] == "simcse_unsup"
    assert last["promptemb_recipe"]["class"] == "simcse_recipe.SimCSE"
    results = json.loads((trained / "results.json").read_text())
    assert {"cls", "mean"} <= set(results["scores"])  # its own poolers, [CLS] first


def test_evaluate_export_and_sentence_transformers_give_the_scored_embeddings(work, trained, real_data_root):
    scored = json.loads((trained / "results.json").read_text())["scores"]["cls"]["STSBenchmark"]
    out = work / "evaluated"
    proc = command("evaluate.py", "imports=[simcse_recipe]", f"backbone.name_or_path={trained}",
                   f"data_root={real_data_root}", "tasks=[STSBenchmark]", f"output_dir={out}", "progress=false",
                   cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["scores"]["cls"]["STSBenchmark"] == pytest.approx(
        scored, abs=1e-6)
    exported = work / "exported"
    proc = command("export.py", "imports=[simcse_recipe]", f"ckpt_path={trained}", f"output_dir={exported}",
                   cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sentences = work / "sentences.txt"
    sentences.write_text("A man is playing a guitar.\nTwo dogs run in the park.\nThe stock market fell.\n")
    encoded = work / "embeddings.npy"
    proc = command("evaluate.py", "mode=encode", "imports=[simcse_recipe]", f"backbone.name_or_path={trained}",
                   "pooler=cls", f"input={sentences}", f"output={encoded}", "progress=false", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from sentence_transformers import SentenceTransformer

    # [CLS] of the plain sentence: standard sentence-transformers modules, loaded without trust_remote_code
    layout = json.loads((exported / "config.json").read_text())["promptemb"]["sentence_transformers"]
    assert layout["format"] == "native"
    model = SentenceTransformer(str(exported), device="cpu")
    reloaded = model.encode(sentences.read_text().splitlines())
    assert_close_scaled(reloaded, np.load(encoded), 1e-6)


def test_a_checkpoint_of_an_unregistered_recipe_is_refused_in_one_line(work, trained, real_data_root):
    out = work / "refused"
    proc = command("evaluate.py", f"backbone.name_or_path={trained}", f"data_root={real_data_root}",
                   f"output_dir={out}", cwd=work)
    assert_one_line_error(proc, r"was trained by recipe 'simcse_unsup' \(simcse_recipe\.SimCSE\), which is not "
                                r"registered in this process: pass imports=\[simcse_recipe\]", out)


def test_a_builtin_name_and_a_broken_module_are_refused_in_one_line(work, real_data_root):
    (work / "takes_a_builtin_name.py").write_text(
        "from promptemb.lightning_modules.promptbert import PromptBERTUnsup\n"
        "from promptemb.lightning_modules.recipe import register_recipe\n\n\n"
        "@register_recipe('promptbert_unsup')\nclass Mine(PromptBERTUnsup):\n    pass\n")
    (work / "broken_module.py").write_text("import a_package_nobody_installed\n")
    out = work / "never"
    for module, pattern in (("takes_a_builtin_name", r"^error: imports=\[takes_a_builtin_name\]: takes_a_builtin_name"
                                                     r"\.Mine cannot be registered as the built-in recipe "
                                                     r"'promptbert_unsup'; register it under another name$"),
                            ("broken_module", r"^error: imports=\[broken_module\]: the module failed to import \(an "
                                              r"error inside it\): ModuleNotFoundError"),
                            ("no_such_module", r"^error: imports=\[no_such_module\]: the module failed to import: "
                                               r"ModuleNotFoundError: No module named 'no_such_module'$")):
        proc = command("evaluate.py", f"imports=[{module}]", f"data_root={real_data_root}", f"output_dir={out}",
                       cwd=work)
        assert_one_line_error(proc, pattern, out)
