"""Fault injection, memory: running out of memory in a training step (a real CPU allocation failure, or CUDA's
out-of-memory error) ends train.py in one line naming the settings that use less memory, and the run is recorded as
failed (status.json), its last complete checkpoint kept."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from promptemb.training.memory import TrainingOutOfMemoryError, is_out_of_memory, out_of_memory_is_one_line
from tests.faults import run_entry
from tests.helpers import assert_one_line_error
from tests.training.test_train import tiny_overrides


def test_what_counts_as_out_of_memory():
    with pytest.raises(RuntimeError) as cpu:
        torch.empty(1 << 60, dtype=torch.uint8)
    assert is_out_of_memory(cpu.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_the_message_names_the_settings_that_use_less_memory():
    # what `trainer.fit` is fitting: the recipe's hyper-parameters and the datamodule, as the message reads them
    recipe = SimpleNamespace(hparams=SimpleNamespace(grad_cache_chunk_size=None, gradient_checkpointing=False))
    trainer = SimpleNamespace(global_step=7, datamodule=SimpleNamespace(batch_size=512), lightning_module=recipe)
    with pytest.raises(TrainingOutOfMemoryError) as failed, out_of_memory_is_one_line(trainer):
        torch.empty(1 << 60, dtype=torch.uint8)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("out of memory at step 7 ([enforce fail")
    assert "data.batch_size (now 512)" in message and "model.grad_cache_chunk_size=N" in message
    assert "model.gradient_checkpointing=true (now false)" in message
    with pytest.raises(ValueError), out_of_memory_is_one_line(trainer):
        raise ValueError("not about memory")  # anything else passes through


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_out_of_memory_in_training_is_one_line_and_marks_the_run_failed(kind, tiny_bert, real_data_root, tmp_path):
    out = tmp_path / "run"
    proc = run_entry("train.py", *tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, None),
                     "callbacks.model_checkpoint.every_n_train_steps=1", "callbacks.model_checkpoint.monitor=null",
                     "callbacks.model_checkpoint.save_top_k=0", "callbacks.sts_evaluation.score_best_at_end=false",
                     "+callbacks.oom._target_=tests.faults.RunOutOfMemory", "+callbacks.oom.step=2",
                     f"+callbacks.oom.kind={kind}", data_root=real_data_root, cwd=tmp_path)
    line = assert_one_line_error(proc, r"^error: out of memory at step 2 \(")
    for fix in ("data.batch_size (now 4)", "model.grad_cache_chunk_size=N", "model.gradient_checkpointing=true"):
        assert fix in line
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["reason"].startswith("out of memory at step 2")
    checkpoints = out / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 1  # step 1's, complete
    assert [p.name for p in checkpoints.iterdir()] == ["last.ckpt"]  # no partial file
