"""CUDA versions of the GPU-path checks (`pytest -m gpu`; skipped on a machine without CUDA). Run by
bench/gpu_validation.py, whose report goes into docs/benchmarks.md."""

from __future__ import annotations

import pytest
import torch

from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup
from promptemb.training import rng_state
from tests.evaluation.test_sharded_evaluation import test_two_ranks_encode_and_score_exactly_like_one_process
from tests.lightning_modules.test_grad_cache import SENTENCES, TRIPLETS, assert_same, chunked_with_graph, loss_and_grads
from tests.training.test_gpu_path import assert_bf16_close, bf16_step, devices_final_scoring_ran_on

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pytest -m gpu)")]
CUDA = torch.device("cuda", 0)


def on_cuda(kind, path, **kwargs):
    torch.manual_seed(0)
    module = {"unsup": PromptBERTUnsup, "sup": PromptBERTSup}[kind](str(path), **kwargs)
    return module.to(CUDA).train()


def test_grad_cache_equals_the_one_graph_step_under_bf16_autocast_on_cuda(tiny_bert):
    """bf16 autocast on the GPU: the cached step's loss and gradients are the one-graph ones, to bf16 precision, and
    every parameter the one-graph step reaches gets its gradient."""
    got = bf16_step(on_cuda("unsup", tiny_bert, grad_cache_chunk_size=3), SENTENCES)
    reference = bf16_step(on_cuda("unsup", tiny_bert, grad_cache_chunk_size=3), SENTENCES, one_graph=True)
    assert_bf16_close(got, reference)


@pytest.mark.parametrize(("kind", "batch"), [("unsup", SENTENCES), ("sup", TRIPLETS)])
def test_grad_cache_replays_dropout_on_cuda(tiny_bert_dropout, kind, batch):
    """Pass 2 replays pass 1's CUDA dropout masks: gradient caching equals the chunked forward with plain autograd."""
    module = on_cuda(kind, tiny_bert_dropout, grad_cache_chunk_size=3)
    reference = chunked_with_graph(module, batch, 3)
    assert_same(loss_and_grads(module, batch), reference, tol=1e-4)


def test_sharded_dev_evaluation_equals_one_process_on_cuda(tiny_bert, real_data_root, tmp_path):
    """Two ranks on the GPU (gloo exchange) encode and score exactly as one process (the CPU test's procedure; the
    encoder takes the GPU when there is one)."""
    test_two_ranks_encode_and_score_exactly_like_one_process(tiny_bert, real_data_root, tmp_path)


def test_final_scoring_runs_on_the_gpu(tiny_bert, tmp_path, monkeypatch):
    module = PromptBERTUnsup(str(tiny_bert)).cpu()  # where Strategy.teardown() leaves it
    assert devices_final_scoring_ran_on(module, CUDA, tmp_path, monkeypatch) == [CUDA]
    assert module.device.type == "cpu"


def test_resume_on_the_same_device_count_continues_the_cuda_generator():
    saved = rng_state.capture()
    expected = torch.rand(4, device=CUDA)
    torch.rand(100, device=CUDA)  # what ran in between
    rng_state.restore(saved)
    torch.testing.assert_close(torch.rand(4, device=CUDA), expected, rtol=0, atol=0)
