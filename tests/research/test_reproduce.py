"""Pinned recipes: the checker of expected scores (fast), and the CPU recipes re-run against them (slow,
`make reproduce`)."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from promptemb.common.errors import ConfigError, DataError
from promptemb.encoder.model_store import is_fetched, models_root
from promptemb.research import expected_scores
from tests.conftest import REPO

RESULTS = {"provenance": {"model": {"best_dev": 82.0}},
           "families": {"sts": {"scores": {"mask": {"avg": 74.0, "STSBenchmark": 77.0}}}}}


def test_quickstart_pins_its_scores():
    pinned = expected_scores.pinned("quickstart_unsup")
    assert pinned["tolerance"] == 0.5
    assert set(pinned["scores"]) >= {"best_dev", "sts/mask/avg"}
    assert {"quickstart_unsup", "quickstart_sup", "quickstart_optiprompt"} <= set(expected_scores.pinned_experiments())


def test_a_continued_run_names_a_pinned_experiment_and_the_key_that_takes_its_checkpoint():
    from promptemb.common.hydra_bridge import compose

    continued = {name: pinned["starts_from"] for name in expected_scores.pinned_experiments()
                 if (pinned := expected_scores.pinned(name)).get("starts_from")}
    assert continued == {"quickstart_pcc_tuning_smollm2": {"experiment": "quickstart_prompteol_sup_smollm2",
                                                          "checkpoint_key": "model.stage_one_adapter"}}
    for name, starts_from in continued.items():
        assert starts_from["experiment"] in expected_scores.pinned_experiments()
        group, key = starts_from["checkpoint_key"].split(".")
        assert key in compose("train", [f"experiment={name}"], resolve=False)[group]


def test_compare_flags_exactly_the_scores_outside_the_band():
    rows = expected_scores.compare({"tolerance": 0.5, "scores": {"best_dev": 82.4, "sts/mask/avg": 74.6,
                                                                 "sts/mask/STSBenchmark": 77.0}}, RESULTS)
    assert [(r["score"], r["ok"]) for r in rows] == [("best_dev", True), ("sts/mask/avg", False),
                                                     ("sts/mask/STSBenchmark", True)]
    assert rows[1]["difference"] == pytest.approx(-0.6)
    text = expected_scores.table(rows)
    assert "| sts/mask/avg | 74.60 | 74.00 | -0.60 | ±0.50 | OUT OF BAND |" in text
    with pytest.raises(DataError, match="no score 'sts/mean/avg'"):
        expected_scores.compare({"scores": {"sts/mean/avg": 1.0}}, RESULTS)
    with pytest.raises(ConfigError, match="is not `best_dev`"):
        expected_scores.compare({"scores": {"mask": 1.0}}, RESULTS)


def test_cli_exit_status(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    proc = subprocess.run([sys.executable, "-m", "promptemb.research.expected_scores", "promptbert_unsup",
                           str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2  # a GPU recipe: nothing pinned
    assert proc.stderr.strip().splitlines() == ["error: experiment 'promptbert_unsup' pins no expected_scores; "
                                                f"pinned: {', '.join(expected_scores.pinned_experiments())}"]
    pinned = expected_scores.pinned("quickstart_unsup")["scores"]
    families = {}
    for name, value in pinned.items():
        if name != "best_dev":
            family, pooler, task = name.split("/")
            families.setdefault(family, {"scores": {}})["scores"].setdefault(pooler, {})[task] = value + 0.4
    families["sts"]["scores"]["mask"]["avg"] = pinned["sts/mask/avg"] - 0.6  # the one score out of band
    record = {"provenance": {"model": {"best_dev": pinned["best_dev"]}}, "families": families}
    (tmp_path / "results.json").write_text(json.dumps(record))
    proc = subprocess.run([sys.executable, "-m", "promptemb.research.expected_scores", "quickstart_unsup",
                           str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout.count("OUT OF BAND") == 1 and "| sts/mask/avg |" in proc.stdout
    assert proc.stderr.strip().splitlines() == ["error: 1 score(s) of quickstart_unsup left their band"]


@pytest.mark.slow
@pytest.mark.parametrize("experiment", expected_scores.pinned_experiments())
def test_cpu_recipe_reproduces_its_pinned_scores(experiment, real_data_root, tmp_path):
    """The full recipe (minutes on a CPU), then every pinned score within its tolerance; the table is printed.
    A recipe on a fetched model (`model:NAME`) is skipped where that model is not fetched."""
    recipe = yaml.safe_load((REPO / "configs" / "experiment" / f"{experiment}.yaml").read_text(encoding="utf-8"))
    name = str((recipe.get("backbone") or {}).get("name_or_path", ""))
    if name.startswith("model:") and not is_fetched(models_root() / name.removeprefix("model:")):
        pytest.skip(f"{name} is not fetched in {models_root()} (promptemb-models fetch {name.removeprefix('model:')})")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PROMPTEMB_DATA": str(real_data_root)}
    extra = []
    if starts_from := expected_scores.pinned(experiment).get("starts_from"):  # the run it continues, first
        first = tmp_path / "first"
        proc = subprocess.run([sys.executable, "train.py", f"experiment={starts_from['experiment']}",
                               f"output_dir={first}"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=3 * 3600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        extra = [f"{starts_from['checkpoint_key']}={first / 'checkpoints' / 'last.ckpt'}"]
    proc = subprocess.run([sys.executable, "train.py", f"experiment={experiment}", f"output_dir={tmp_path / 'run'}",
                           *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=3 * 3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = expected_scores.check_run(experiment, tmp_path / "run")
    print(f"\n{experiment}:\n{expected_scores.table(rows)}")
    assert all(row["ok"] for row in rows), expected_scores.table(rows)
