"""W&B sweep files: each validates against train.py's config, one sampled configuration becomes the exact command
a `wandb agent` would run (wandb's own command builder), and that command trains a tiny BERT; a parameter train.py
does not know is named in one line, by the validator and by train.py itself."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from promptemb.common.errors import ConfigError
from promptemb.training.sweeps import (
    _wandb_sweep_utils,
    agent_command,
    load_sweep,
    sample,
    sample_parameter,
    validate_sweep,
)
from tests.conftest import REPO
from tests.training.test_train import WIKI_SAMPLE
from tests.wandb_offline import read_run

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


def subprocess_env(tmp_path, real_data_root=None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HF_HUB_OFFLINE="1", WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(tmp_path),
               WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"), WANDB_CACHE_DIR=str(tmp_path / "wandb_cache"))
    if real_data_root:
        env["PROMPTEMB_DATA"] = str(real_data_root)
    return env


def test_sweep_files_exist_and_validate():
    assert [p.stem for p in SWEEPS] == ["optiprompt", "promptbert_unsup"]
    for path in SWEEPS:
        spec = load_sweep(path)
        validate_sweep(spec, where=f"sweep {path.name}")
        assert spec["program"] == "train.py" and "${args_no_hyphens}" in spec["command"]
        assert spec["metric"] == {"name": "val/stsb_dev/mask_best", "goal": "maximize"}  # not the last value
    unsup = load_sweep(REPO / "sweeps/promptbert_unsup.yaml")["parameters"]
    assert {"optimizer.lr", "model.temperature", "template", "data.batch_size"} <= set(unsup)


def test_command_is_built_by_wandbs_own_code_path(monkeypatch):
    assert _wandb_sweep_utils() is not None  # wandb.sdk.launch.sweeps.utils, importable without the service
    monkeypatch.setenv("PROMPTEMB_TEST_TAG", "abc")
    spec = {"program": "train.py",
            "command": ["${env}", "${interpreter}", "${program}", "tag=${envvar:PROMPTEMB_TEST_TAG}",
                        "${args_no_hyphens}"]}
    assert agent_command(spec, {"optimizer.lr": 1e-05, "template": "word_pair"}) == [
        "/usr/bin/env", "python", "train.py", "tag=abc", "optimizer.lr=1e-05", "template=word_pair"]


def test_local_sampler_respects_the_spec():
    rng = random.Random(0)
    for _ in range(200):
        lr = sample_parameter({"distribution": "log_uniform_values", "min": 1e-6, "max": 1e-4}, rng)
        assert 1e-6 <= lr <= 1e-4
        assert sample_parameter({"values": [64, 128]}, rng) in (64, 128)
        assert sample_parameter({"distribution": "int_uniform", "min": 1, "max": 3}, rng) in (1, 2, 3)
    with pytest.raises(ConfigError, match="distribution 'beta' is not supported"):
        validate_sweep({**load_sweep(SWEEPS[0]), "parameters": {"optimizer.lr": {"distribution": "beta"}}})


@pytest.mark.parametrize("sweep", [pytest.param(p, marks=pytest.mark.slow) if p.stem != "promptbert_unsup" else p
                                   for p in SWEEPS], ids=[p.stem for p in SWEEPS])
def test_agent_command_of_a_sampled_configuration_trains(sweep, tiny_bert, real_data_root, tmp_path):
    spec = load_sweep(sweep)
    params = sample(spec, random.Random(7))
    argv = agent_command(spec, params, interpreter=sys.executable, program=str(REPO / "train.py"))
    out = tmp_path / "out"
    tiny = [f"backbone.name_or_path={tiny_bert}", f"output_dir={out}", "trainer.accelerator=cpu",
            "trainer.precision=32-true", "trainer.max_steps=2", "trainer.max_epochs=1", "eval_every_n_steps=2",
            "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", "data.download=null",
            f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=600", "data.num_workers=0"]
    assert not {t.split("=", 1)[0] for t in tiny} & set(params)  # the sampled values reach train.py unchanged
    proc = subprocess.run(argv + tiny, cwd=REPO, env=subprocess_env(tmp_path, real_data_root), capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "results.json").is_file() and (out / "curve.json").is_file()
    config = json.loads((out / "results.json").read_text())["provenance"]["config"]
    for key, value in params.items():
        if key == "template":
            group = yaml.safe_load((REPO / "configs/template" / f"{value}.yaml").read_text())
            assert config["model"]["templates"] == [group["text"], group["second_text"]]
        else:
            section, name = key.split(".")
            assert config[section][name] == pytest.approx(value)
    (run_dir,) = (out / "wandb").glob("offline-run-*")  # logger=wandb in the sweep command; offline here
    assert read_run(run_dir)["config"]["optimizer"]["lr"] == pytest.approx(params["optimizer.lr"])


@pytest.fixture()
def bad_sweep(tmp_path) -> Path:
    spec = load_sweep(REPO / "sweeps/promptbert_unsup.yaml")
    spec["parameters"]["model.learning_rate"] = {"values": [1e-5, 3e-5]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_unknown_parameter_is_named(bad_sweep, tmp_path):
    with pytest.raises(ConfigError, match=r"^sweep bad\.yaml: parameter \(experiment=promptbert_unsup\) "
                                          r"'model\.learning_rate' is not a key of train\.py's config; .*"
                                          r"prefix it with '\+' \(\+model\.learning_rate=\.\.\.\)"):
        validate_sweep(load_sweep(bad_sweep), where="sweep bad.yaml")
    spec = load_sweep(REPO / "sweeps/promptbert_unsup.yaml")
    spec["parameters"]["template"]["values"].append("nope")
    with pytest.raises(ConfigError, match=r"parameter 'template' is the config group template/: values "
                                          r"must be among .*minilm_searched, minilm_searched_pair, none, .*"
                                          r"\(got \['nope'\]\)"):
        validate_sweep(spec)
    spec["parameters"] = {"optimizer": {"parameters": {"lr": {"value": 1e-5}}}}
    with pytest.raises(ConfigError, match="nested parameters are not Hydra overrides: use dotted keys"):
        validate_sweep(spec)


@pytest.mark.slow
def test_unknown_parameter_one_line_from_the_checker_and_from_train_py(bad_sweep, tmp_path):
    env = subprocess_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "promptemb.training.sweeps", "check", str(bad_sweep)], cwd=REPO,
                          env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: sweep {bad_sweep}: parameter (experiment=promptbert_unsup) "
                                  "'model.learning_rate' is not a key of train.py's config")
    assert len(proc.stderr.strip().splitlines()) == 1
    # what a W&B agent would run with it: train.py itself refuses it in one line, before loading anything
    spec = load_sweep(bad_sweep)
    argv = agent_command(spec, sample(spec, random.Random(0)), interpreter=sys.executable)
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: 'model.learning_rate' is not a key of train.py's config; did you mean 'optimizer.lr'? "
        "prefix it with '+' (+model.learning_rate=...) only if it is really a new key"]
