"""Fault injection, checkpoint writes: the temporary file is made next to the checkpoint (never in $TMPDIR, which may
be another filesystem) and renamed over it; a writer killed mid-write leaves the previous checkpoint loadable and a
partial file that the next run on the folder removes; a write that fails (disk full, file size limit) is one line,
with every earlier checkpoint byte-identical and nothing left behind."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from promptemb.training import checkpointing
from promptemb.training.checkpointing import (
    PARTIAL_SUFFIX,
    AtomicCheckpointIO,
    CheckpointWriteError,
    remove_orphaned_partials,
)
from tests.conftest import REPO
from tests.faults import listing, run_entry
from tests.helpers import assert_one_line_error, tree_digest
from tests.training.test_train import tiny_overrides


def state(value: float) -> dict:
    return {"state_dict": {"w": torch.full((256, 256), value)}, "global_step": int(value)}


def test_checkpoint_is_written_next_to_its_target_whatever_tmpdir_is(tmp_path, monkeypatch):
    other_tmp = tmp_path / "elsewhere"
    other_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(other_tmp))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(checkpointing.os, "replace", spy)
    target = tmp_path / "run" / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(state(1.0), target)
    AtomicCheckpointIO().save_checkpoint(state(2.0), target)
    assert [(src.parent, dst) for src, dst in seen] == [(target.parent, target)] * 2
    assert all(src.name.startswith(".last.ckpt.") and src.name.endswith(PARTIAL_SUFFIX) for src, _ in seen)
    assert torch.load(target, weights_only=True)["global_step"] == 2
    assert listing(other_tmp) == [] and listing(target.parent) == ["last.ckpt"]


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EFBIG, errno.EIO])
def test_a_failed_write_is_one_line_and_keeps_the_older_checkpoint(tmp_path, monkeypatch, error):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(state(1.0), target)
    before = tree_digest(tmp_path)

    def full(fd):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(checkpointing.os, "fsync", full)
    with pytest.raises(CheckpointWriteError) as failed:
        AtomicCheckpointIO().save_checkpoint(state(2.0), target)
    message = str(failed.value)
    assert "\n" not in message and os.strerror(error) in message and "last.ckpt" in message
    assert "intact" in message and "ckpt_path=last" in message
    assert tree_digest(tmp_path) == before  # the older checkpoint byte-identical, no partial file left


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_orphans_of_dead_writers_are_removed_and_live_or_foreign_ones_kept(tmp_path):
    host = socket.gethostname().split(".")[0]
    orphan = tmp_path / f".last.ckpt.{host}.{dead_pid()}.abc123{PARTIAL_SUFFIX}"
    live = tmp_path / f".last.ckpt.{host}.{os.getpid()}.def456{PARTIAL_SUFFIX}"
    foreign = tmp_path / f".last.ckpt.otherhost.{dead_pid()}.ghi789{PARTIAL_SUFFIX}"
    keep = tmp_path / "last.ckpt"
    for path in (orphan, live, foreign, keep):
        path.write_bytes(b"x" * 100)
    assert remove_orphaned_partials(tmp_path) == [orphan]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, foreign, keep))


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    """SIGKILL while the new file is half written: the target is the previous, complete checkpoint."""
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(state(1.0), target)
    code = (f"import os, signal, torch\nfrom promptemb.training import checkpointing\n"
            f"real = os.fsync\n"
            f"def die(fd):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
            f"checkpointing.os.fsync = die\n"
            f"checkpointing.AtomicCheckpointIO().save_checkpoint("
            f"{{'state_dict': {{'w': torch.full((256, 256), 2.0)}}, 'global_step': 2}}, {str(target)!r})\n")
    killed = subprocess.run([sys.executable, "-c", code], cwd=REPO)
    assert killed.returncode == -9
    assert torch.load(target, weights_only=True)["global_step"] == 1
    partials = [p for p in tmp_path.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    assert len(partials) == 1  # the killed writer's, removed by the next run on the folder:
    assert remove_orphaned_partials(tmp_path) == partials and listing(tmp_path) == ["last.ckpt"]


@pytest.mark.slow
def test_train_py_at_the_file_size_limit_fails_in_one_line_with_checkpoints_intact(tiny_bert, real_data_root,
                                                                                     tmp_path):
    out = tmp_path / "run"
    base = [*tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, None), "eval_every_n_steps=2",
            "callbacks.sts_evaluation.score_best_at_end=false"]
    first = run_entry("train.py", *base, "trainer.max_steps=2", data_root=real_data_root, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoints = out / "checkpoints"
    before = tree_digest(checkpoints)
    size_kb = (checkpoints / "last.ckpt").stat().st_size // 1024
    resumed = run_entry("train.py", *base, "trainer.max_steps=4", f"ckpt_path={checkpoints / 'last.ckpt'}",
                        data_root=real_data_root, cwd=tmp_path, prefix=f"ulimit -f {size_kb // 2};")
    assert_one_line_error(resumed, r"^error: could not write checkpoint .*: File too large; the checkpoints "
                                     r"written before are intact")
    after = tree_digest(checkpoints)
    assert after["last.ckpt"] == before["last.ckpt"]  # the write that hit the limit left the previous one
    # a smaller best checkpoint of the resumed steps may have been written before the limit was hit: whatever is
    # there is whole
    for name in after:
        assert torch.load(checkpoints / name, map_location="cpu", weights_only=True)["global_step"] in (2, 4), name
    assert not [p for p in checkpoints.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]


@pytest.mark.slow
def test_kill_9_loop_with_tmpdir_on_another_filesystem(tmp_path):
    """scripts/checkpoint_kill_loop.py: 10 SIGKILLs during writes of last.ckpt ($TMPDIR in /dev/shm), 10 loadable
    last.ckpt, no orphan file after the next run."""
    if not Path("/dev/shm").is_dir() or not os.environ.get("PROMPTEMB_DATA"):
        pytest.skip("needs /dev/shm and PROMPTEMB_DATA")
    proc = subprocess.run([sys.executable, "scripts/checkpoint_kill_loop.py", "--out", str(tmp_path / "loop")],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "10 loadable last.ckpt; final resume exit 0; 0 orphan file(s)" in proc.stdout
