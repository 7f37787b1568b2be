"""Fault injection, run folders: one run per folder (a live run's lock, stale locks of dead processes taken over, a
fresh run into a finished run's folder refused, `overwrite=true` to replace it) and one policy for a failed run's
folder (kept and marked failed when it holds a checkpoint, removed when it holds nothing of value). Every refusal:
exit 2, one last `error:` line, no traceback, the folder byte-identical."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.run_context import RunContext
from promptemb.encoder.sources import source_kind
from promptemb.inference.model_sources import best_checkpoint
from promptemb.training.run_folder import LOCK_FILE, check_run_folder, folder_lock, lock_holder, outcome
from tests.helpers import assert_one_line_error, error_starting
from tests.run_faults import WIKI_SAMPLE, fast_overrides, snapshot, train_py


def test_fresh_run_into_a_finished_runs_folder_is_refused(finished_run):
    out = finished_run["out"]
    before = snapshot(out)
    proc = train_py(*finished_run["overrides"])
    line = assert_one_line_error(proc, error_starting(f"output_dir {out} already holds a run (completed); "))
    assert f"resume it with ckpt_path={out / 'checkpoints' / 'last.ckpt'}" in line and "overwrite=true" in line
    assert snapshot(out) == before


@pytest.mark.parametrize("ckpt", ["last", "path"])
def test_overwrite_while_resuming_the_same_run_is_refused_and_deletes_nothing(finished_run, ckpt):
    """`overwrite=true` clears the folder before training: with `ckpt_path` naming one of that folder's own
    checkpoints it would delete what it resumes from (then crash); refused in one line, the folder untouched."""
    out = finished_run["out"]
    last = out / "checkpoints" / "last.ckpt"
    before = snapshot(out)
    proc = train_py(*finished_run["overrides"], "trainer.max_steps=6", "overwrite=true",
                    f"ckpt_path={'last' if ckpt == 'last' else last}")
    assert_one_line_error(proc, error_starting(f"overwrite=true would delete {last}, the checkpoint this run resumes "
                                               "from: drop overwrite=true to resume the run, or ckpt_path"))
    assert snapshot(out) == before


def test_a_live_runs_lock_refuses_every_other_run_and_goes_with_it(tmp_path):
    folder = tmp_path / "run"
    with folder_lock(folder):
        holder = lock_holder(folder)
        assert holder == f"pid {os.getpid()} on {os.uname().nodename}"
        with pytest.raises(ConfigError, match=rf"output_dir {folder} is in use by a live run \(pid {os.getpid()} "):
            check_run_folder(folder, None, overwrite=True)  # not even overwrite=true takes a live run's folder
        with pytest.raises(ConfigError, match="is in use by a live run"), folder_lock(folder):
            pass
    assert not (folder / LOCK_FILE).exists() and lock_holder(folder) is None


def test_a_dead_processes_lock_is_stale_and_taken_over(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": "gone"}) + "\n")
    assert lock_holder(folder) is None  # no process holds the flock: the kernel released it with the process
    check_run_folder(folder, None, overwrite=False)
    with folder_lock(folder):
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (folder / LOCK_FILE).exists()


@pytest.mark.slow
def test_resume_into_a_folder_a_live_run_holds_is_refused_in_one_line(finished_run):
    out = finished_run["out"]
    before = snapshot(out)
    with folder_lock(out):  # this test process plays the live run
        inside = snapshot(out)
        proc = train_py(*finished_run["overrides"], "trainer.max_steps=6",
                        f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}")
        assert_one_line_error(proc, error_starting(f"output_dir {out} is in use by a live run (pid {os.getpid()} on "))
        assert snapshot(out) == inside
    assert snapshot(out) == before


@pytest.mark.slow
def test_a_stale_lock_does_not_stop_the_resume_and_leaves_no_lock_behind(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run["out"], out)
    (out / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "crashed"}) + "\n")
    overrides = [o if not o.startswith("output_dir=") else f"output_dir={out}" for o in finished_run["overrides"]]
    proc = train_py(*overrides, "trainer.max_steps=6", f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    assert not (out / LOCK_FILE).exists()


@pytest.mark.slow
def test_overwrite_true_replaces_the_previous_run(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run["out"], out)
    overrides = [o if not o.startswith("output_dir=") else f"output_dir={out}" for o in finished_run["overrides"]]
    proc = train_py(*overrides, "trainer.max_steps=2", "overwrite=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["last.ckpt", "step2.ckpt"]
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))  # starts over: only this run's steps
    assert [int(row["step"]) for row in rows if row.get("train/loss")] == [0, 1]
    assert json.loads((out / "status.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("fault, extra, message", [
    pytest.param("batch larger than the corpus", ["data.max_examples=3"],
                 "corpus has 3 examples after filtering, fewer than", marks=pytest.mark.slow),
    pytest.param("blank corpus", ["CORPUS=\n\n"], "", marks=pytest.mark.slow),
    pytest.param("non-UTF-8 corpus", ["CORPUS=a line\n\xff\xfe bad\n"], "", marks=pytest.mark.slow),
])
def test_a_run_that_fails_without_a_checkpoint_leaves_nothing_behind(fault, extra, message, tiny_bert,
                                                                      real_data_root, tmp_path):
    """The failed-run policy: no checkpoint = nothing of value; the folder (and the empty folders this run made
    above it) is removed, whatever the failure."""
    corpus = real_data_root / WIKI_SAMPLE
    if extra[0].startswith("CORPUS="):
        corpus = tmp_path / "corpus.txt"
        corpus.write_bytes(extra.pop(0)[len("CORPUS="):].encode("latin-1"))
    out = tmp_path / "logs" / "run"
    proc = train_py(*fast_overrides(tiny_bert, real_data_root, out, corpus, *extra), cwd=tmp_path)
    assert_one_line_error(proc, error_starting(message))
    assert not (tmp_path / "logs").exists()


def test_evaluate_on_a_run_folder_without_checkpoints_is_one_line(tmp_path):
    """A kept run folder without a checkpoint is still a run folder to evaluate.py: it says so, instead of trying to
    load a tokenizer from it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text('{"status": "failed"}\n')
    assert source_kind(str(run)) == "run"
    with pytest.raises(ConfigError, match=rf"run folder {run} has no scored checkpoint in {run / 'checkpoints'}"):
        best_checkpoint(run)


@pytest.mark.parametrize("with_checkpoint", [False, True])
def test_the_failed_run_policy_keeps_only_runs_with_a_checkpoint(with_checkpoint, tmp_path, monkeypatch):
    """In process, for any failure: without a checkpoint every file the run wrote goes (and the empty folders it made
    under the working directory); with one, the folder stays, marked failed with the one-line reason."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "logs" / "run"

    def fails_after_writing():
        for folder in (".hydra", "csv", *(["checkpoints"] if with_checkpoint else [])):
            (run / folder).mkdir(parents=True, exist_ok=True)
        for name in ("train.log", "curve.json", "curve.png", "results_transfer.png", LOCK_FILE,
                     *(["checkpoints/last.ckpt"] if with_checkpoint else [])):
            (run / name).write_bytes(b"x")
        raise DataError("training corpus x.txt is blank")

    with pytest.raises(DataError, match="is blank"), outcome(run, RunContext(), taken=True):
        fails_after_writing()
    if with_checkpoint:
        status = json.loads((run / "status.json").read_text())
        assert status["status"] == "failed" and status["reason"] == "training corpus x.txt is blank"
    else:
        assert not (tmp_path / "logs").exists()


def test_a_refusal_before_the_run_leaves_an_existing_folder_as_it_was(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (run / "status.json").write_text('{"status": "completed"}\n')
    before = snapshot(run)

    with pytest.raises(ConfigError), outcome(run, RunContext()):  # refused before the run took its folder
        raise ConfigError("cannot resume from it: it was trained with other settings: data.batch_size 4 -> 8")
    assert snapshot(run) == before
