"""Each command composes its configuration once and checks it once: a train.py command (a resume included, whose
preflight runs once, before Hydra's job), a multirun (the sweep's own composition, then each job's), the parent and
each trial of an Optuna search, an evaluate.py command. Counted in the real entry points (Hydra's
`ConfigLoaderImpl.load_configuration`, the settings checks), run as users run them (a subprocess each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_faults import WIKI_SAMPLE as WIKI
from tests.run_faults import fast_overrides

#: Runs an entry point's `main()` with the configuration checks counted (written as JSON to $COUNTS at exit).
COUNTED_MAIN = """
import atexit, json, os, sys
from hydra._internal import config_loader_impl
import promptemb.evaluation.settings as evaluate_settings
import promptemb.training.lineage as lineage
import promptemb.training.settings as train_settings
counts = {"compositions": 0, "train": 0, "evaluate": 0, "lineage": 0}

def counted(module, name, key):
    check = getattr(module, name)
    def wrapper(*args, **kwargs):
        counts[key] += 1
        return check(*args, **kwargs)
    setattr(module, name, wrapper)

counted(config_loader_impl.ConfigLoaderImpl, "load_configuration", "compositions")
counted(train_settings, "check_train_composition", "train")
counted(evaluate_settings, "check_template", "evaluate")
counted(lineage, "check_lineage", "lineage")  # once per preflight of a resume
atexit.register(lambda: open(os.environ["COUNTS"], "w").write(json.dumps(counts)))
entry = sys.argv.pop(1)
sys.argv[0] = entry + ".py"
if entry == "train":
    from promptemb.training.command_line import main
else:
    from promptemb.inference.command_line import main
main()
"""


def counted(entry: str, *args: str, cwd: Path) -> tuple[dict, subprocess.CompletedProcess]:
    counts = cwd / f"counts-{len(list(cwd.glob('counts-*')))}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "COUNTS": str(counts)}
    proc = subprocess.run([sys.executable, "-c", COUNTED_MAIN, entry, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    return json.loads(counts.read_text()), proc


def test_a_run_its_resume_and_each_multirun_job_are_checked_once(tiny_bert, real_data_root, tmp_path):
    run = tmp_path / "run"
    counts, proc = counted("train", *fast_overrides(tiny_bert, real_data_root, run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert counts == {"compositions": 1, "train": 1, "evaluate": 0, "lineage": 0}
    # a resume: checked, and its preflight run, before Hydra's job writes into the folder; not again by the task
    counts, proc = counted("train", *fast_overrides(tiny_bert, real_data_root, run), "trainer.max_steps=6",
                           f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert counts == {"compositions": 1, "train": 1, "evaluate": 0, "lineage": 1}
    sweep = [o for o in fast_overrides(tiny_bert, real_data_root, run, WIKI, "trainer.max_steps=2")
             if not o.startswith("output_dir=")]
    counts, proc = counted("train", "-m", *sweep, "optimizer.lr=1e-3,2e-3", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                           cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the first job's keys checked before the sweep starts (a key no job takes is refused once, not recorded as a
    # failure of each), Hydra's composition of the sweep, then two per job, each job checked once in it: Hydra's
    # basic sweeper composes every job of a batch to validate it (Sweeper.validate_batch_is_legal) before the
    # launcher composes it again to run it
    assert counts == {"compositions": 6, "train": 3, "evaluate": 0, "lineage": 0}


@pytest.mark.slow
def test_an_optuna_search_checks_its_config_and_each_trial_once(tiny_bert, real_data_root, tmp_path):
    out = tmp_path / "study"
    searched = ("optimizer.lr=",)  # the search sets it in each trial
    overrides = [o for o in fast_overrides(tiny_bert, real_data_root, out, WIKI, "trainer.max_steps=2")
                 if not o.startswith(searched)]
    counts, proc = counted("train", *overrides, "hparams_search=quickstart_optuna", "hparams_search.n_trials=2",
                           cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the search's own config, then each trial's
    assert counts == {"compositions": 3, "train": 3, "evaluate": 0, "lineage": 0}
    assert [row["status"] for row in json.loads((out / "summary.json").read_text())["trials"]] == ["completed"] * 2


def test_evaluate_checks_its_config_once(tiny_bert, mini_data, tmp_path):
    root, registry = mini_data
    counts, proc = counted("evaluate", f"backbone.name_or_path={tiny_bert}", f"data_root={root}",
                           f"task_registry={registry}", f"output_dir={tmp_path / 'out'}", "tasks=[MINI-B]",
                           "poolers=[mean]", "progress=false", "backbone.device=cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert counts == {"compositions": 1, "train": 0, "evaluate": 1, "lineage": 0}
    assert (tmp_path / "out" / "results.json").is_file()
