"""Fault injection, interrupts: Ctrl-C (SIGINT) inside a sweep's trial records the trial as interrupted and writes the
sweep's table before the sweep stops (exit 130, one `error:` line, no traceback); the line of a stopped run is the
exact command that resumes it, which works even when the run had its own `output_dir=`; a run interrupted before
its first checkpoint leaves nothing behind."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import REPO
from tests.helpers import assert_one_line_error, error_starting
from tests.run_faults import fast_overrides, train_py

SIGINT_AT = ["+callbacks.kill._target_=tests.helpers.KillAtStep", "+callbacks.kill.signum=2"]


def run_printed_command(line: str) -> subprocess.CompletedProcess:
    """Run the command an `error:` line ends with, as a user pasting it would."""
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert Path(command[0]).name.startswith("python"), command  # python, or the interpreter's path (python3...)
    return train_py(*command[2:])  # the same interpreter and train.py, with exactly the printed arguments


def test_ctrl_c_in_a_sweep_trial_records_it_and_writes_the_sweep_summary(tiny_bert, real_data_root, tmp_path):
    sweep = tmp_path / "sweep"
    base = [o for o in fast_overrides(tiny_bert, real_data_root, tmp_path / "unused") if not o.startswith("output")]
    proc = train_py("-m", *base, *SIGINT_AT, "+callbacks.kill.step=3,3", f"hydra.sweep.dir={sweep}")
    line = assert_one_line_error(proc, error_starting("interrupted (Ctrl-C) at step 3; resume with: "), status=130)
    assert f"output_dir={sweep / '0'} ckpt_path={sweep / '0' / 'checkpoints' / 'last.ckpt'}" in line
    status = json.loads((sweep / "0" / "status.json").read_text())
    assert status["status"] == "interrupted" and status["reason"].startswith("interrupted (Ctrl-C) at step 3")
    summary = json.loads((sweep / "summary.json").read_text())
    assert [(row["trial"], row["status"]) for row in summary["trials"]] == [(0, "interrupted")]
    assert "(interrupted)" in summary["title"] and (sweep / "summary.md").is_file()
    assert not (sweep / "1").exists()  # the sweep stopped: the second trial never started


@pytest.mark.slow
def test_the_interrupted_trial_resumes_with_the_printed_command(tiny_bert, real_data_root, tmp_path):
    sweep = tmp_path / "sweep"
    base = [o for o in fast_overrides(tiny_bert, real_data_root, tmp_path / "unused") if not o.startswith("output")]
    proc = train_py("-m", *base, *SIGINT_AT, "+callbacks.kill.step=3", f"hydra.sweep.dir={sweep}")
    line = assert_one_line_error(proc, error_starting("interrupted (Ctrl-C) at step 3; resume with: "), status=130)
    resumed = run_printed_command(line.replace("+callbacks.kill.step=3", "+callbacks.kill.step=99"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(sweep / "0" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    assert json.loads((sweep / "0" / "status.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_leaves_nothing(tiny_bert, real_data_root, tmp_path):
    out = tmp_path / "logs" / "run"
    proc = train_py(*fast_overrides(tiny_bert, real_data_root, out), *SIGINT_AT,
                    "+callbacks.kill.step=1", cwd=tmp_path)
    assert_one_line_error(proc, error_starting("interrupted (Ctrl-C) at step 1; no checkpoint was saved, so there "
                                               "is nothing to resume"), status=130)
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_sigterm_hint_is_the_exact_command_even_with_output_dir(tiny_bert, real_data_root, tmp_path):
    """`ckpt_path=last` would look for the newest run under logs/, not in this output_dir: the printed command names
    both, and running it as printed finishes the run."""
    out = tmp_path / "elsewhere"
    sigterm_at_3 = ["+callbacks.kill._target_=tests.helpers.KillAtStep", "+callbacks.kill.step=3",
                    "+callbacks.kill.signum=15"]
    proc = train_py(*fast_overrides(tiny_bert, real_data_root, out), *sigterm_at_3, cwd=REPO)
    last = out.resolve() / "checkpoints" / "last.ckpt"
    line = assert_one_line_error(proc, error_starting(f"preempted (SIGTERM) at step 3: saved {last}; resume with: "),
                                 status=143)
    assert line.endswith(f"output_dir={out.resolve()} ckpt_path={last}")
    assert json.loads((out / "status.json").read_text())["status"] == "preempted"
    resumed = run_printed_command(line.replace("+callbacks.kill.step=3", "+callbacks.kill.step=99"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


@pytest.mark.slow
def test_ctrl_c_in_an_optuna_trial_writes_the_study_and_its_table(tiny_bert, real_data_root, tmp_path):
    configs = tmp_path / "configs" / "hparams_search"
    configs.mkdir(parents=True)
    study = {"study_name": "two", "direction": "maximize", "n_trials": 2, "storage": None,
             "sampler": {"_target_": "optuna.samplers.RandomSampler", "seed": 0},
             "enqueue": [{"optimizer.lr": 1.0e-4}], "params": {"optimizer.lr": "tag(log, interval(1e-5, 1e-3))"}}
    (configs / "two.yaml").write_text("# @package _global_\n" + yaml.safe_dump({"hparams_search": study}))
    out = tmp_path / "study"
    searched = [o for o in fast_overrides(tiny_bert, real_data_root, out) if not o.startswith("optimizer.lr=")]
    proc = train_py(f"--config-dir={tmp_path / 'configs'}", *searched,  # the study sets optimizer.lr
                    "hparams_search=two", *SIGINT_AT, "+callbacks.kill.step=3")
    line = assert_one_line_error(proc, error_starting("interrupted (Ctrl-C) at step 3; resume with: "), status=130)
    trial = out / "trials" / "0"
    assert line.endswith(f"optimizer.lr=0.0001 output_dir={trial.resolve()} "
                         f"ckpt_path={(trial / 'checkpoints' / 'last.ckpt').resolve()}")
    assert "hparams_search" not in line and f"--config-dir={tmp_path / 'configs'}" in line
    assert json.loads((trial / "status.json").read_text())["status"] == "interrupted"
    assert [row["status"] for row in json.loads((out / "summary.json").read_text())["trials"]] == ["interrupted"]
    assert [t["state"] for t in json.loads((out / "study.json").read_text())["trials"]] == ["FAIL"]
    assert not (out / "trials" / "1").exists()
