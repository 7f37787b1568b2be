"""Seed reports: mean ± std (ddof 1), min and max of every score over seeds, per-seed rows kept, one-line errors."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from promptemb.common.errors import ConfigError, DataError
from promptemb.research import seed_report
from tests.conftest import REPO

TASKS = ("STS12", "STSBenchmark")


def write_run(folder, seed, offset, config=None, poolers=("mask", "avg"), best_dev=80.0):
    scores = {p: {t: 70.0 + offset + i + 0.5 * j for j, t in enumerate(TASKS)} for i, p in enumerate(poolers)}
    for row in scores.values():
        row["avg"] = sum(row[t] for t in TASKS) / len(TASKS)
    pearson = {p: {t: v - 1.0 for t, v in row.items()} for p, row in scores.items()}
    # as a resolved train.py config: the seed and the run folder repeat inside it (data.seed, checkpoint folder)
    config = {"seed": seed, "output_dir": str(folder), "module": {"lr": 3e-5}, "data": {"seed": seed},
              "callbacks": {"checkpoint": {"dirpath": f"{folder}/checkpoints"}}, **(config or {})}
    record = {"scores": scores, "details": {},
              "families": {"sts": {"scores": scores, "pearson": pearson}},
              "provenance": {"seed": seed, "config": config, "input": {"template": "[X] means [MASK] ."},
                             "model": {"name_or_path": "tiny", "best_dev": best_dev + offset,
                                       "selected_on": "val/stsb_dev/mask"}}}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(record))
    curve = {"points": [{"step": 0, "mask": 40.0, "avg": 80.0, "seconds": 1.0},
                        {"step": 25, "mask": 60.0 + offset, "avg": 81.0 + offset, "seconds": 1.0}]}
    (folder / "curve.json").write_text(json.dumps(curve))
    return scores


@pytest.fixture()
def sweep(tmp_path):
    offsets = {0: 0.0, 1: 1.5, 2: -0.7}
    scores = {seed: write_run(tmp_path / "sweep" / str(seed), seed, offset) for seed, offset in offsets.items()}
    return tmp_path / "sweep", scores, offsets


def test_every_score_is_mean_std_min_max_over_seeds(sweep, tmp_path):
    folder, scores, offsets = sweep
    report, written = seed_report.seed_report([folder], tmp_path / "out")
    assert report["seeds"] == [0, 1, 2]
    for pooler in ("mask", "avg"):
        for task in (*TASKS, "avg"):
            values = np.array([scores[seed][pooler][task] for seed in (0, 1, 2)])
            cell = report["families"]["sts"]["scores"][pooler][task]
            assert cell["mean"] == pytest.approx(values.mean(), abs=1e-12)
            assert cell["std"] == pytest.approx(values.std(ddof=1), abs=1e-12)
            assert (cell["min"], cell["max"], cell["n"]) == (values.min(), values.max(), 3)
            pearson = report["families"]["sts"]["pearson"][pooler][task]
            assert pearson["mean"] == pytest.approx(values.mean() - 1.0, abs=1e-12)
    best = np.array([80.0 + offsets[s] for s in (0, 1, 2)])
    assert report["dev"]["best_dev"]["mean"] == pytest.approx(best.mean())
    assert report["dev"]["best_dev"]["std"] == pytest.approx(best.std(ddof=1))
    step25 = report["dev"]["curve"][1]
    assert step25["step"] == 25 and step25["mask"]["max"] == 61.5 and step25["mask"]["min"] == 59.3
    assert report["dev"]["curve"][0]["avg"]["std"] == 0.0
    assert [row["families"]["sts"]["scores"] for row in report["per_seed"]] == [scores[0], scores[1], scores[2]]
    assert {path.name for path in written} == {"seed_report.json", "seed_report.md", "seed_report.png"}
    text = (tmp_path / "out" / "seed_report.json").read_text()
    assert "NaN" not in text and json.loads(text)["provenance"]["std"].startswith("sample standard deviation")
    md = (tmp_path / "out" / "seed_report.md").read_text()
    mask_avg = report["families"]["sts"]["scores"]["mask"]["avg"]
    assert f"{mask_avg['mean']:.2f} ± {mask_avg['std']:.2f}" in md
    assert "| 1 | mask |" in md  # per-seed rows
    assert (tmp_path / "out" / "seed_report.png").stat().st_size > 10_000


def test_one_run_has_no_std(tmp_path):
    write_run(tmp_path / "r", 7, 0.0)
    report, _ = seed_report.seed_report([tmp_path / "r"], tmp_path / "out")
    cell = report["families"]["sts"]["scores"]["mask"]["avg"]
    assert cell["std"] is None and cell["n"] == 1
    assert json.loads((tmp_path / "out" / "seed_report.json").read_text())["seeds"] == [7]


def test_runs_that_differ_in_more_than_the_seed_are_refused(tmp_path):
    write_run(tmp_path / "a", 0, 0.0)
    write_run(tmp_path / "b", 1, 0.0, config={"module": {"lr": 1e-5}})
    with pytest.raises(ConfigError, match=r"differ in 'module\.lr', not only in the seed"):
        seed_report.seed_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    write_run(tmp_path / "c", 0, 1.0)
    with pytest.raises(ConfigError, match="seed 0 appears in more than one run"):
        seed_report.seed_report([tmp_path / "a", tmp_path / "c"], tmp_path / "out")
    write_run(tmp_path / "e", 3, 0.0, config={"data": {"seed": 5}})
    with pytest.raises(ConfigError, match=r"differ in 'data\.seed'"):  # not this run's own seed
        seed_report.seed_report([tmp_path / "a", tmp_path / "e"], tmp_path / "out")
    write_run(tmp_path / "d", 2, 0.0, poolers=("mask",))
    with pytest.raises(ConfigError, match="different poolers or tasks"):
        seed_report.seed_report([tmp_path / "a", tmp_path / "d"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no results\.json"):
        seed_report.find_runs([tmp_path / "empty"])
    assert not (tmp_path / "out").exists()


def test_cli_bad_input_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "promptemb.research.seed_report", str(tmp_path / "missing")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'missing'} does not exist; pass run folders or "
                                                "a sweep folder"]


@pytest.mark.slow
def test_a_multirun_over_seed_writes_the_report_into_its_sweep_folder(tiny_bert, real_data_root, tmp_path):
    """`train.py -m ... seed=0,1`: each job trains with its seed; the sweep folder gets the report of both."""
    from tests.training.test_train import WIKI_SAMPLE

    sweep_dir = tmp_path / "sweep"
    overrides = ["-m", "experiment=quickstart_unsup", f"backbone.name_or_path={tiny_bert}",
                 f"data_root={real_data_root}", "trainer.accelerator=cpu", "trainer.precision=32-true",
                 "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", "data.batch_size=4", "data.num_workers=0",
                 "data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64",
                 "trainer.max_steps=2", "eval_every_n_steps=2", "seed=0,1", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run([sys.executable, "train.py", *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "seed report: 2 seeds [0, 1]" in proc.stdout
    report = json.loads((sweep_dir / "seed_report.json").read_text())
    jobs = [json.loads((sweep_dir / str(job) / "results.json").read_text()) for job in (0, 1)]
    assert [job["provenance"]["seed"] for job in jobs] == [0, 1] == report["seeds"]
    for pooler, row in report["families"]["sts"]["scores"].items():
        for task, cell in row.items():
            values = [job["families"]["sts"]["scores"][pooler][task] for job in jobs]
            assert cell["mean"] == pytest.approx(sum(values) / 2, abs=1e-12)
            assert cell["std"] == pytest.approx(math.fabs(values[0] - values[1]) / math.sqrt(2), abs=1e-12)
    assert jobs[0]["scores"] != jobs[1]["scores"]  # the seed changed the run
    assert (sweep_dir / "seed_report.png").is_file() and (sweep_dir / "summary.md").is_file()
