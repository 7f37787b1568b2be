"""Exact resume: a run killed between checkpoints and resumed equals the uninterrupted run (metrics.csv rows, dev
curve, final weights; bit-identical on CPU), on raw sentences or pre-tokenized data (identical inputs, so identical
runs), with 0 or 2 dataloader workers and under 2-process DDP; SIGTERM saves
a checkpoint and says how to resume; run folders can be moved; `ckpt_path=last` finds the newest run."""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from promptemb.data.sampling import DataPosition, EpochSampler
from tests.conftest import REPO
from tests.training.test_train import WIKI_SAMPLE

KILL = ["+callbacks.kill._target_=tests.helpers.KillAtStep", "+callbacks.kill.step=5"]


def overrides(model: Path, root: Path, out: Path, *extra: str) -> list[str]:
    return ["experiment=quickstart_unsup", f"backbone.name_or_path={model}", f"data_root={root}",
            f"output_dir={out}", "trainer.accelerator=cpu", "trainer.precision=32-true", "data.batch_size=4",
            "data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=24", "trainer.max_steps=9",
            "trainer.max_epochs=2",
            "eval_every_n_steps=4", "optimizer.lr=1e-3", "trainer.log_every_n_steps=1",
            "callbacks.sts_evaluation.score_best_at_end=false",
            *extra]


def train_py(*args: str, cwd: Path = REPO, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    if cache is not None:  # where pre-tokenized corpora go
        env["PROMPTEMB_CACHE"] = str(cache)
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=400)


def run_state(out: Path) -> dict:
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    points = [{k: v for k, v in p.items() if k != "seconds"} for p in
              json.loads((out / "curve.json").read_text())["points"]]
    weights = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    return {"rows": rows, "points": points, "weights": weights}


def assert_same_run(resumed: dict, uninterrupted: dict) -> None:
    """Exact on any CPU: both runs are train.py processes on this machine in this environment, so the same kernels
    (instruction set, thread count) sum in the same order; only runs on different machines could differ in bits."""
    assert resumed["points"] == uninterrupted["points"]
    assert resumed["rows"] == uninterrupted["rows"]
    assert resumed["weights"].keys() == uninterrupted["weights"].keys()
    for name, tensor in uninterrupted["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name


@pytest.fixture(scope="module")
def uninterrupted(tiny_bert_dropout, real_data_root, tmp_path_factory) -> dict:
    full = tmp_path_factory.mktemp("uninterrupted")
    proc = train_py(*overrides(tiny_bert_dropout, real_data_root, full, "data.pretokenize=false"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = run_state(full)
    assert [p["step"] for p in state["points"]] == [0, 4, 8]
    return state


@pytest.mark.parametrize("extra", [pytest.param(["data.pretokenize=false"], marks=pytest.mark.slow),
                                   ["data.num_workers=2"]],
                         ids=["raw-no-workers", "pretokenized-2-workers"])
def test_killed_run_resumes_exactly(extra, uninterrupted, tiny_bert_dropout, real_data_root, tmp_path):
    """9 steps over a 6-batch epoch: the kill at step 5 falls between the step-4 checkpoint and the epoch's end, the
    resumed run crosses into epoch 1. Dropout is on, so the RNG state matters too. The data order depends neither on
    the workers nor on pre-tokenization: both variants must equal the same uninterrupted run (raw sentences, no
    workers); the pre-tokenized one is killed after building its cache and resumes from it."""
    killed, cache = tmp_path / "killed", tmp_path / "cache"
    proc = train_py(*overrides(tiny_bert_dropout, real_data_root, killed, *extra, *KILL), cache=cache)
    assert proc.returncode == -9
    assert torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    assert len(list((cache / "pretokenized").glob("*/key.json"))) == ("data.pretokenize=false" not in extra)
    proc = train_py(*overrides(tiny_bert_dropout, real_data_root, killed, *extra,
                               f"ckpt_path={killed / 'checkpoints' / 'last.ckpt'}"), cache=cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(run_state(killed), uninterrupted)


@pytest.mark.slow
def test_killed_ddp_run_resumes_exactly(tiny_bert_dropout, real_data_root, tmp_path):
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc = train_py(*overrides(tiny_bert_dropout, real_data_root, full, *ddp, "data.max_examples=48"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = train_py(*overrides(tiny_bert_dropout, real_data_root, killed, *ddp, "data.max_examples=48", *KILL))
    assert proc.returncode != 0
    proc = train_py(*overrides(tiny_bert_dropout, real_data_root, killed, *ddp, "data.max_examples=48",
                               "ckpt_path=" + str(killed / "checkpoints" / "last.ckpt")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(run_state(killed), run_state(full))


def test_sigterm_saves_a_checkpoint_and_says_how_to_resume(uninterrupted, tiny_bert_dropout, real_data_root,
                                                           tmp_path):
    stopped = tmp_path / "stopped"
    term = ["+callbacks.kill._target_=tests.helpers.KillAtStep", "+callbacks.kill.step=5",
            "+callbacks.kill.signum=15"]
    proc = train_py(*overrides(tiny_bert_dropout, real_data_root, stopped, *term))
    assert proc.returncode == 143
    last = stopped / "checkpoints" / "last.ckpt"
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: preempted (SIGTERM) at step 5: saved {last.resolve()}; resume with: ")
    assert proc.stderr.strip().endswith(f"output_dir={stopped.resolve()} ckpt_path={last.resolve()}")
    assert torch.load(last, weights_only=True)["global_step"] == 5
    printed = shlex.split(proc.stderr.strip().splitlines()[-1].split("resume with: ", 1)[1])
    assert printed[1] == str(REPO / "train.py")
    assert train_py(*printed[2:]).returncode == 0  # the printed command, as a user pastes it
    assert_same_run(run_state(stopped), uninterrupted)


@pytest.mark.slow
def test_moved_run_folder_resumes_with_its_best_checkpoint(tiny_bert, real_data_root, tmp_path):
    first = tmp_path / "first"
    assert train_py(*overrides(tiny_bert, real_data_root, first, "trainer.max_steps=4")).returncode == 0
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(first, moved)
    saved = torch.load(moved / "checkpoints" / "last.ckpt", weights_only=True)
    state = next(v for k, v in saved["callbacks"].items() if k.startswith("RunCheckpoint"))
    assert state["dirpath"] == "." and not os.path.isabs(state["best_model_path"])
    proc = train_py(*overrides(tiny_bert, real_data_root, moved, "trainer.max_steps=6",
                               "callbacks.sts_evaluation.score_best_at_end=true",
                               "callbacks.sts_evaluation.final_tasks=[STSBenchmark]",
                               f"ckpt_path={moved / 'checkpoints' / 'last.ckpt'}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((moved / "results.json").read_text())
    best = Path(results["provenance"]["model"]["checkpoint"])
    assert best.parent == (moved / "checkpoints").resolve() and best.is_file()


def last_run_overrides(tiny_bert: Path, real_data_root: Path, tmp_path: Path) -> list[str]:
    """No output_dir: runs go to logs/<task>/runs/<timestamp> under the working directory."""
    base = [o for o in overrides(tiny_bert, real_data_root, tmp_path) if not o.startswith("output_dir=")]
    return [*base, "eval_every_n_steps=2", "trainer.max_steps=2"]


def test_ckpt_path_last_with_nothing_to_resume_is_one_line_and_leaves_nothing(tiny_bert, real_data_root, tmp_path):
    proc = train_py(*last_run_overrides(tiny_bert, real_data_root, tmp_path), "ckpt_path=last", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: nothing to resume: no run under logs/quickstart_unsup has checkpoints/last.ckpt; start a fresh run "
        "(drop ckpt_path/resume) or pass ckpt_path=PATH"]
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_ckpt_path_last_resumes_the_newest_run_of_the_task(tiny_bert, real_data_root, tmp_path):
    """`resume=true` (= `ckpt_path=last`) continues the newest run of the task in its own folder."""
    base = last_run_overrides(tiny_bert, real_data_root, tmp_path)
    assert train_py(*base, cwd=tmp_path).returncode == 0
    (run,) = (tmp_path / "logs" / "quickstart_unsup" / "runs").iterdir()
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "train.log").is_file()  # Hydra's logs inside
    proc = train_py(*base, "trainer.max_steps=4", "resume=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "logs" / "quickstart_unsup" / "runs").iterdir()) == [run]
    points = json.loads((run / "curve.json").read_text())["points"]
    assert [p["step"] for p in points] == [0, 2, 4]


def test_epoch_sampler_order_is_a_function_of_seed_and_epoch_and_resumes_at_a_batch():
    sampler = EpochSampler(num_examples=22, per_device_batch_size=2, seed=7, world_size=2, rank=0)
    assert len(sampler) == 10 and sampler.batches_per_epoch == 5
    generator = torch.Generator().manual_seed(7 + 1)
    expected = torch.randperm(22, generator=generator)[:20].tolist()
    sampler.set_epoch(1)
    rank0 = list(sampler)
    rank1 = list(EpochSampler(22, 2, seed=7, world_size=2, rank=1, resume_at=DataPosition(1, 0)))
    assert rank0 == expected[0::2] and rank1 == expected[1::2]
    resumed = EpochSampler(22, 2, seed=7, world_size=2, rank=0, resume_at=DataPosition(1, 3))
    assert list(resumed) == rank0[6:]
    resumed.set_epoch(2)  # the skip belongs to the resumed epoch only
    assert len(list(resumed)) == 10


@pytest.mark.slow
def test_ckpt_path_last_with_output_dir_resumes_that_folder_never_another_run(tiny_bert, real_data_root, tmp_path):
    """`output_dir=DIR ... ckpt_path=last` (the preemption message's "same command plus ckpt_path=last") resumes
    DIR's own last.ckpt; a DIR without one is one line, and no other run of the task is resumed into it."""
    base = last_run_overrides(tiny_bert, real_data_root, tmp_path)
    assert train_py(*base, cwd=tmp_path).returncode == 0  # another run of the task, newest under logs/
    empty = tmp_path / "empty"
    proc = train_py(*base, f"output_dir={empty}", "ckpt_path=last", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: nothing to resume in {empty}: it has no checkpoints/last.ckpt; drop ckpt_path/resume for a fresh "
        "run, or pass ckpt_path=PATH of the checkpoint to resume")
    (run,) = (tmp_path / "logs" / "quickstart_unsup" / "runs").iterdir()
    before = (run / "curve.json").read_text()
    named = tmp_path / "named"
    assert train_py(*base, f"output_dir={named}", cwd=tmp_path).returncode == 0
    os.utime(run / "checkpoints" / "last.ckpt")  # the other run's last.ckpt is the task's newest again
    proc = train_py(*base, f"output_dir={named}", "trainer.max_steps=4", "ckpt_path=last", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p["step"] for p in json.loads((named / "curve.json").read_text())["points"]] == [0, 2, 4]
    assert (run / "curve.json").read_text() == before
