"""The CUDA surface: the calls libraries make only on a CUDA device that read state this project sets, each executed
here on the CPU with the state the CUDA device profile leaves (docs/training.md, "The CUDA surface").

Only the device queries a CPU cannot answer are patched (`torch.cuda.is_available`, `get_device_capability`,
`get_device_name`, and `set_device`, which has no device to select): the code under them is the libraries' own. A
call that cannot run on a CPU at all is listed in docs/training.md with the reason.
"""

from __future__ import annotations

import contextlib
import logging
from unittest.mock import patch

import pytest
import pytorch_lightning as pl
import torch
from lightning_fabric.accelerators import cuda as fabric_cuda
from pytorch_lightning.accelerators.cuda import CUDAAccelerator
from pytorch_lightning.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader
from torch.utils.data._utils.pin_memory import pin_memory

from promptemb.common.device_profile import (
    REHEARSE_CUDA,
    exact_matmuls,
    precision_views,
    preserved_matmul_precision,
)
from promptemb.data.pretokenized import pad_sentence_ids
from promptemb.lightning_modules.promptbert import PromptBERTUnsup
from promptemb.training.trainer import Trainer
from tests.lightning_modules.test_grad_cache import SENTENCES

#: What every legacy getter answers with TF32 on (training on CUDA) and off (scoring).
TF32_ON = {"float32_matmul_precision": "high", "cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": True}
TF32_OFF = {"float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False}
HOPPER = torch.device("cuda", 0)


def legacy_views() -> dict:
    views = precision_views()
    return {name: views[name] for name in TF32_ON}


@contextlib.contextmanager
def cuda_device_queries(capability=(9, 0), name="NVIDIA H200"):
    """A CPU that answers CUDA's device queries as an H200 does; Lightning's once-per-process precision check is
    cleared before and after, so it runs here and again in the next test."""
    fabric_cuda._check_cuda_matmul_precision.cache_clear()
    with patch.object(torch.cuda, "is_available", return_value=True), \
            patch.object(torch.cuda, "get_device_capability", return_value=capability), \
            patch.object(torch.cuda, "get_device_name", return_value=name), \
            patch.object(torch.cuda, "set_device"):
        try:
            yield
        finally:
            fabric_cuda._check_cuda_matmul_precision.cache_clear()


def lightning_cuda_setup(caplog) -> list[str]:
    """Lightning's CUDA accelerator set-up of device 0 (what `Strategy.setup_environment` runs at every fit on a
    GPU); the messages it logged."""
    caplog.clear()
    with caplog.at_level(logging.INFO), cuda_device_queries():
        CUDAAccelerator().setup_device(HOPPER)
    return [record.getMessage() for record in caplog.records]


@pytest.fixture()
def rehearsed(monkeypatch):
    """The CUDA profile rehearsed on the CPU; every precision switch put back afterwards."""
    monkeypatch.setenv(REHEARSE_CUDA, "1")
    with preserved_matmul_precision():
        yield


def cuda_trainer(**settings) -> Trainer:
    """The project's Trainer as `trainer=gpu` builds it: bf16-mixed, clipping at 1.0."""
    return Trainer(**{"accelerator": "gpu", "devices": 1, "precision": "bf16-mixed", "gradient_clip_val": 1.0,
                      "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                      "enable_model_summary": False, **settings})


# -- TF32: both APIs answer after every transition -----------------------------------------------------------------


def test_every_tf32_getter_answers_after_each_transition(rehearsed, caplog):
    trainer = cuda_trainer()
    assert trainer.device_profile.kind == "cuda" and trainer.device_profile.rehearsal and trainer.tf32
    training = precision_views()
    assert legacy_views() == TF32_ON
    assert {training["cuda.matmul.fp32_precision"], training["cudnn.conv.fp32_precision"],
            training["cudnn.rnn.fp32_precision"]} == {"tf32"}
    assert not any("Tensor Cores" in message for message in lightning_cuda_setup(caplog))  # it reads `high`
    with exact_matmuls():
        assert legacy_views() == TF32_OFF
        inside = precision_views()
        assert (inside["cuda.matmul.fp32_precision"], inside["mkldnn.matmul.fp32_precision"],
                inside["mkldnn.conv.fp32_precision"]) == ("ieee", "ieee", "ieee")
        lightning_cuda_setup(caplog)  # answers here too (and would suggest TF32: it is off)
    assert precision_views() == training  # every getter of both APIs, as before the block
    lightning_cuda_setup(caplog)


def test_the_new_api_alone_is_the_state_lightning_cannot_read(rehearsed, caplog):
    """The state the profile left before this fix (`fp32_precision = "tf32"` only): Lightning's set-up raises,
    which is why the test above reads every getter."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        lightning_cuda_setup(caplog)
    with exact_matmuls():  # scoring inside that state still gets readable IEEE switches
        assert legacy_views() == TF32_OFF


@pytest.mark.parametrize("start", ["fresh", "set_float32_matmul_precision", "onednn_bf16"])
def test_exact_matmuls_restores_every_getter_of_both_apis(rehearsed, start):
    if start == "set_float32_matmul_precision":
        torch.set_float32_matmul_precision("high")
    elif start == "onednn_bf16":
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    before = precision_views()
    with exact_matmuls():
        assert legacy_views() == TF32_OFF
        with exact_matmuls():  # nested scoring blocks
            assert legacy_views() == TF32_OFF
        assert legacy_views() == TF32_OFF
    assert precision_views() == before


def test_lightning_cuda_setup_on_a_pre_ampere_device_reads_nothing(rehearsed, caplog):
    cuda_trainer()
    fabric_cuda._check_cuda_matmul_precision.cache_clear()
    with cuda_device_queries(capability=(7, 0), name="Tesla V100"), \
            patch.object(torch, "get_float32_matmul_precision", side_effect=AssertionError("read")):
        CUDAAccelerator().setup_device(HOPPER)


# -- fp16: the GradScaler path runs in the rehearsal ---------------------------------------------------------------


class StepProbe(pl.Callback):
    """The scaler's scale and the gradient norm the optimiser's step used (after unscaling and clipping)."""

    def __init__(self):
        self.norms: list[float] = []
        self.scales: list[float] = []

    def on_train_start(self, trainer, pl_module):
        def record(optimizer, args, kwargs):
            grads = [p.grad.float() for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            norms = torch.stack([torch.linalg.vector_norm(g) for g in grads])
            self.norms.append(float(torch.linalg.vector_norm(norms)))

        trainer.optimizers[0].register_step_post_hook(record)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.scales.append(float(trainer.precision_plugin.scaler.get_scale()))


def test_fp16_rehearsal_runs_the_grad_scaler_with_foreach_adamw_and_clipping(rehearsed, tiny_bert):
    """`trainer=gpu trainer.precision=16-mixed`: Lightning would turn 16-mixed into bf16-mixed on its CPU
    accelerator; the rehearsal keeps what a GPU runs: fp16 autocast, a GradScaler that scales the loss and unscales
    before clipping, and foreach AdamW (fused would unscale after clipping)."""
    probe = StepProbe()
    torch.manual_seed(0)
    module = PromptBERTUnsup(str(tiny_bert))
    trainer = cuda_trainer(precision="16-mixed", max_steps=2, callbacks=[probe])
    assert isinstance(trainer.precision_plugin, MixedPrecision) and trainer.precision == "16-mixed"
    assert isinstance(trainer.precision_plugin.scaler, torch.amp.GradScaler)
    trainer.fit(module, DataLoader([SENTENCES] * 2, batch_size=None, collate_fn=lambda batch: batch))
    assert trainer.global_step == 2 and trainer.optimizers[0].defaults["foreach"] is True
    assert probe.scales == [65536.0, 65536.0]  # the loss was scaled ...
    assert len(probe.norms) == 2 and max(probe.norms) <= 1.0 * (1 + 1e-4)  # ... and unscaled before clipping
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert trainer.device_profile.describe(module.optimizer_factory)["optimizer_implementation"] == "foreach"


# -- pinned memory, autocast, inductor --------------------------------------------------------------------------------


def test_pinned_memory_reaches_every_tensor_of_a_training_batch():
    """A CUDA loader with `pin_memory=True` runs torch's `pin_memory` over each batch in its pin thread (pinning
    itself needs a CUDA device: `Tensor.pin_memory` is recorded instead). A pre-tokenized batch (a dict of tensors,
    also [B, S, L] triplets) is pinned tensor by tensor; a raw-sentence batch has nothing to pin and comes back as
    it was."""
    pinned = []

    def record(tensor, *args, **kwargs):
        pinned.append(tensor)
        return tensor

    pretokenized = [pad_sentence_ids([[101, 7, 8, 102], [101, 9, 102]]),
                    pad_sentence_ids([([101, 7, 102], [101, 8, 9, 102], [101, 102])] * 2)]
    raw = [("a man plays", "a dog runs"), ["a man plays", "a dog runs"]]
    with patch.object(torch.Tensor, "pin_memory", record):
        for batch in pretokenized:
            pinned.clear()
            out = pin_memory(batch)
            assert set(out) == {"ids", "lengths"}
            assert [id(t) for t in pinned] == [id(batch["ids"]), id(batch["lengths"])]
        for batch in raw:
            pinned.clear()
            assert pin_memory(batch) == batch and not pinned


def test_cuda_autocast_accepts_what_the_profile_asks_for():
    """`torch.autocast("cuda", dtype=torch.bfloat16)`: what Lightning's bf16-mixed plugin opens around every
    training forward on a GPU and the encoder opens for `backbone.autocast=bf16`; its checks (bf16 support on the
    device) run here with the device queries answered; the region is entered and left."""
    with patch.object(torch.cuda, "is_available", return_value=True), \
            patch.object(torch.cuda, "is_bf16_supported", return_value=True):
        region = MixedPrecision("bf16-mixed", "cuda").autocast_context_manager()
        assert region.device == "cuda" and region.fast_dtype == torch.bfloat16
        with region:
            assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16
        assert not torch.is_autocast_enabled("cuda")


def test_inductor_reads_the_tf32_switches_after_a_compiled_step(rehearsed):
    """Under `trainer.compile=true` Dynamo writes the CUDA matmul precision back through the new API after each
    frame it converts, and Inductor reads the legacy getters when it keys and builds CUDA kernels
    (`select_algorithm.create_precompile_key`, the conv templates' `cudnn.allow_tf32`): after a compiled call under
    the CUDA profile every getter still answers."""
    from torch._inductor.select_algorithm import create_precompile_key

    trainer = cuda_trainer()
    assert trainer.tf32
    compiled = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w), dynamic=False)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(compiled(x, w), torch.nn.functional.gelu(x @ w), rtol=1e-5, atol=1e-6)
    assert legacy_views() == TF32_ON
    assert create_precompile_key("mm", "inputs", []) == "mm:inputs:high"
    assert torch.backends.cudnn.allow_tf32 is True
