"""Divergence guard and sweep-safe failures: a non-finite loss, dev score or weight stops the run at that step with one
line and exit != 0, nothing is saved from that state, every JSON file stays strict; a failed trial of a multirun or
an Optuna search is recorded and the others run; one table at the end; the collapse warning."""

from __future__ import annotations

import json
import math

import pytest
import torch

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.common.errors import DivergenceError
from promptemb.common.io import atomic_write_json
from promptemb.training.runner import train
from tests.training.test_resume import overrides, train_py
from tests.training.test_train import checked, compose_train, tiny_overrides

POISON = "+callbacks.poison._target_=tests.helpers.PoisonWeights"


def strict_json(path):
    def refuse(token):
        raise ValueError(f"{path} holds {token}, not valid JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_non_finite_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(tiny_bert, real_data_root,
                                                                              tmp_path):
    out = tmp_path / "out"
    proc = train_py(*overrides(tiny_bert, real_data_root, out, "eval_every_n_steps=2", POISON,
                               "+callbacks.poison.step=3"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: loss is nan at step 3; stopped before the optimiser step, the saved checkpoints are from before it; "
        "lower optimizer.lr, clip gradients (trainer.gradient_clip_val=1.0) or train in fp32")
    assert "Traceback" not in proc.stderr
    saved = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values() if t.is_floating_point())
    assert [p["step"] for p in strict_json(out / "curve.json")["points"]] == [0, 2]
    status = strict_json(out / "status.json")
    assert status["status"] == "failed" and status["reason"].startswith("loss is nan at step 3")


@pytest.mark.slow
def test_non_finite_dev_score_stops_before_the_checkpoint(tiny_bert, real_data_root, tmp_path, monkeypatch):
    real = STSEvaluationCallback.score

    def nan_at_step_4(self, module, tasks, *args, **kwargs):
        result = real(self, module, tasks, *args, **kwargs)
        if module.global_step == 4:
            result[0]["scores"]["mask"] = {task: float("nan") for task in result[0]["scores"]["mask"]}
        return result

    monkeypatch.setattr(STSEvaluationCallback, "score", nan_at_step_4)
    out = tmp_path / "out"
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, None),
                         "eval_every_n_steps=2", "trainer.max_steps=6"])
    with pytest.raises(DivergenceError, match=r"dev score val/stsb_dev/mask is nan at step 4: the model diverged"):
        train(checked(cfg))
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    points = strict_json(out / "curve.json")["points"]
    assert [p["step"] for p in points] == [0, 2, 4] and points[-1]["mask"] is None


def test_non_finite_weights_are_never_saved(tiny_bert, real_data_root, tmp_path):
    """Weights poisoned right before a checkpoint is due (after the step's loss was finite): no save, one line."""
    out = tmp_path / "out"
    cfg = compose_train([*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, None),
                         "eval_every_n_steps=2", "trainer.max_steps=6",
                         "callbacks.sts_evaluation.evaluate_before_training=false", POISON,
                         "+callbacks.poison.step=4", "callbacks.model_checkpoint.monitor=null",
                         "callbacks.model_checkpoint.filename='step{step}'"])
    cfg.callbacks.sts_evaluation.every_n_steps = 1000  # no dev score to trip first
    with pytest.raises(DivergenceError, match=r"weights are not finite at step 4 \(.*\); stopped without saving"):
        train(checked(cfg))
    saved = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2


def test_strict_json_writes_null_for_non_finite(tmp_path):
    path = atomic_write_json(tmp_path / "x.json", {"a": float("nan"), "b": [1.0, float("inf")], "c": torch.tensor(2.5),
                                                   "d": "nan"})
    assert strict_json(path) == {"a": None, "b": [1.0, None], "c": 2.5, "d": "nan"}


@pytest.mark.parametrize("history, warned", [
    ([(0, 40.9), (25, 82.5), (50, 80.0)], False),
    ([(0, 40.9), (25, 12.0), (50, 3.1)], True),
])
def test_run_summary_names_the_best_step_and_warns_on_collapse(history, warned, tmp_path):
    callback = STSEvaluationCallback.from_config(output_dir=str(tmp_path))
    callback.history = [{"step": step, "mask": score} for step, score in history]
    line = callback.summary()
    best_step, best = max(history[1:], key=lambda point: point[1])
    assert line.startswith(f"best val/stsb_dev/mask {best:.2f} at step {best_step} (step 0: 40.90, final step 50: ")
    assert ("WARNING: the final dev score is below the untrained model's" in line) == warned


@pytest.mark.slow
def test_multirun_with_a_failing_middle_trial_runs_the_others_and_exits_non_zero(tiny_bert, real_data_root,
                                                                                 tmp_path):
    base = [o for o in overrides(tiny_bert, real_data_root, tmp_path) if not o.startswith("output_dir=")]
    sweep = tmp_path / "sweep"
    proc = train_py("-m", *base, "trainer.max_steps=2", "eval_every_n_steps=2", POISON,
                    "+callbacks.poison.step=99,1,99", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: 1 of 3 trials did not complete; see {sweep / 'summary.md'}")
    rows = strict_json(sweep / "summary.json")["trials"]
    assert [(row["trial"], row["status"]) for row in rows] == [(0, "completed"), (1, "failed"), (2, "completed")]
    assert rows[1]["reason"].startswith("loss is nan at step 1")
    assert all(math.isfinite(row["objective"]) for row in (rows[0], rows[2]))
    for job in range(3):  # every trial its own folder
        assert (sweep / str(job) / "status.json").is_file()
    assert (sweep / "0" / "checkpoints" / "last.ckpt").is_file() and (sweep / "2" / "curve.json").is_file()


@pytest.mark.slow
def test_optuna_search_records_the_failed_trial_and_goes_on(tiny_bert, real_data_root, tmp_path):
    configs = tmp_path / "configs" / "hparams_search"
    configs.mkdir(parents=True)
    (configs / "three.yaml").write_text(
        "# @package _global_\n"
        "hparams_search:\n"
        "  study_name: three\n  direction: maximize\n  n_trials: 3\n  storage: null\n"
        "  sampler: {_target_: optuna.samplers.RandomSampler, seed: 0}\n"
        "  enqueue:\n"
        "    - {optimizer.lr: 1.0e-4, +callbacks.poison.step: 99}\n"
        "    - {optimizer.lr: 1.0e-4, +callbacks.poison.step: 1}\n"
        "    - {optimizer.lr: 2.0e-4, +callbacks.poison.step: 99}\n"
        "  params:\n"
        "    optimizer.lr: tag(log, interval(1e-5, 1e-3))\n"
        "    +callbacks.poison.step: choice(99, 1)\n")
    out = tmp_path / "study"
    searched = [o for o in overrides(tiny_bert, real_data_root, out) if not o.startswith("optimizer.lr=")]
    proc = train_py(f"--config-dir={tmp_path / 'configs'}", *searched,  # the study sets optimizer.lr
                    "hparams_search=three", "trainer.max_steps=2", "eval_every_n_steps=2", POISON)
    assert proc.returncode == 1, proc.stderr[-3000:]
    study = strict_json(out / "study.json")
    assert [t["state"] for t in study["trials"]] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert study["best"]["trial"] in (0, 2)
    rows = strict_json(out / "summary.json")["trials"]
    assert [row["status"] for row in rows] == ["completed", "failed", "completed"]
    assert (out / "trials" / "1" / "status.json").is_file() and (out / "trials" / "2" / "curve.json").is_file()


@pytest.mark.parametrize("epoch_batches, max_steps, global_step, done, expected", [
    (1135, 50, 0, 0, 50),        # a short run in a long epoch: the bar ends with the run
    (1135, -1, 0, 0, 1135),      # epoch-bounded
    (6, 9, 6, 0, 3),             # second epoch of a 9-step run
    (1135, 50, 30, 30, 50),      # resumed mid-epoch at step 30
])
def test_progress_bar_total_follows_max_steps(epoch_batches, max_steps, global_step, done, expected):
    from types import SimpleNamespace

    from promptemb.training.progress import StepBoundedProgressBar

    progress = SimpleNamespace(current=SimpleNamespace(ready=done))
    trainer = SimpleNamespace(num_training_batches=epoch_batches, max_steps=max_steps, global_step=global_step,
                              max_epochs=1,
                              accumulate_grad_batches=1,
                              fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))
    bar = StepBoundedProgressBar()
    bar._trainer = trainer
    assert bar.total_train_batches == expected
