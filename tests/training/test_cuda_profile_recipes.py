"""Every experiment's GPU command (`train.py experiment=NAME trainer=gpu`) through the real train.py composition and the
real Lightning Trainer, on the CPU with the CUDA device profile (`PROMPTEMB_REHEARSE_CUDA=1`): fused AdamW, bf16-mixed,
gradient clipping at the recipe's norm, TF32 flags, loader workers and pinned memory, as on a GPU.

Only the backbone (a tiny random model of the recipe's family), the data (the final scoring: STS-B alone), the batch
size and where the run writes are overridden; never `trainer.*`, `optimizer.*` or the precision. The run stops after 2
optimiser steps (a test callback); the gradient norm each step used is at most the recipe's clipping value. Before the
device profile clipped without Lightning's mixed-precision plugin, the six recipes that clip failed here with the GPU's
"does not allow for gradient clipping ... Are you using a 'fused' optimizer?"."""

from __future__ import annotations

import functools
import json

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.accelerators.cuda import CUDAAccelerator
from pytorch_lightning.plugins.precision import MixedPrecision

from promptemb.common.device_profile import REHEARSE_CUDA, matmul_precision, preserved_matmul_precision
from promptemb.training import trainer as trainer_module
from promptemb.training.command_line import experiment_names
from promptemb.training.runner import train
from tests.decoder_helpers import save_prompteol_adapter, save_tiny_decoder
from tests.training.test_cuda_surface import HOPPER, TF32_ON, cuda_device_queries, legacy_views
from tests.training.test_train import WIKI_SAMPLE, checked, compose_train

STEPS = 2
BATCH = 4


class CudaProfileProbe(pl.Callback):
    """Records what the run trains with, and the total norm of the gradients each optimiser step used (after
    clipping); stops
    the run after `STEPS` optimiser steps."""

    def __init__(self):
        self.norms: list[float] = []
        self.seen: dict = {}

    def setup(self, trainer, pl_module, stage):
        """Lightning's CUDA accelerator set-up, at the point of the fit where a GPU run makes it (it reads the
        matmul precision the profile set), with the device queries answered as an H200 does."""
        with cuda_device_queries():
            CUDAAccelerator().setup_device(HOPPER)
        self.seen["precision_at_setup"] = legacy_views()

    def on_train_start(self, trainer, pl_module):
        optimizer = trainer.optimizers[0]
        loader = trainer.train_dataloader
        self.seen = {**self.seen, "optimizer": type(optimizer), "fused": optimizer.defaults.get("fused"),
                     "plugin": type(trainer.precision_plugin), "scaler": trainer.precision_plugin.scaler,
                     "precision": trainer.precision, "profile": trainer.device_profile,
                     "matmuls": matmul_precision(), "workers": loader.num_workers, "pin_memory": loader.pin_memory,
                     "persistent_workers": loader.persistent_workers}

        def record_norm(opt, args, kwargs):
            grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
            self.norms.append(float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(g.float()) for g in grads]))))

        optimizer.register_step_post_hook(record_norm)  # the gradients the update used (zeroed only later)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= STEPS:
            trainer.should_stop = True


@pytest.fixture()
def probe(monkeypatch):
    """The CUDA profile rehearsed on the CPU, a probe callback in every Trainer train.py builds, every precision
    switch restored."""
    monkeypatch.setenv(REHEARSE_CUDA, "1")
    probe = CudaProfileProbe()
    build = trainer_module.Trainer.__init__

    @functools.wraps(build)  # the config check reads the constructor's signature
    def with_probe(self, *args, **kwargs):
        build(self, *args, **{**kwargs, "callbacks": [*(kwargs.get("callbacks") or []), probe]})

    monkeypatch.setattr(trainer_module.Trainer, "__init__", with_probe)
    with preserved_matmul_precision():
        yield probe


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_decoder(tmp_path_factory.mktemp("tiny_llama"), "llama", layers=2, hidden=32)


@pytest.fixture(scope="module")
def stage_one(tiny_llama, tmp_path_factory):
    """Stage-one adapters of the tiny LLaMA for Pcc-tuning, one per base dtype (the adapter belongs to its base as
    loaded)."""
    folder = tmp_path_factory.mktemp("stage_one")
    return {dtype: save_prompteol_adapter(tiny_llama, folder / f"{dtype}.ckpt", dtype=dtype, lora_r=4)
            for dtype in ("float32", "bfloat16")}


@pytest.fixture()
def triplets_csv(tmp_path):
    rows = [("a man plays a guitar", "a person plays music", "nobody plays anything"),
            ("a dog runs outside", "an animal is moving", "the dog sleeps"),
            ("two kids are eating", "children eat food", "the kids are starving"),
            ("a woman slices onions", "someone cuts vegetables", "a woman is sleeping")] * 4
    path = tmp_path / "nli.csv"
    path.write_text("sent0,sent1,hard_neg\n" + "".join(",".join(r) + "\n" for r in rows))
    return path


def gpu_command(name: str, backbone, data_root, out, triplets, stage_one) -> list[str]:
    """The experiment's GPU command with the overrides this test may make: backbone, data, batch size, folders, the
    adapter a second stage starts from."""
    command = [f"experiment={name}", "trainer=gpu"]
    cfg = compose_train(command)
    overrides = [*command, f"backbone.name_or_path={backbone}", f"data_root={data_root}", f"output_dir={out}",
                 f"data.batch_size={BATCH}", "callbacks.sts_evaluation.final_tasks=[STSBenchmark]"]
    if cfg.data._target_.endswith("TextLinesDataModule"):
        overrides += ["data.download=null", f"data.files=[{WIKI_SAMPLE}]", f"data.max_examples={4 * BATCH}"]
    elif cfg.data.format == "nli_csv":
        overrides += ["data.download=null", f"data.file={triplets}"]
    if "stage_one_adapter" in cfg.model:
        overrides.append(f"model.stage_one_adapter={stage_one[cfg.model.dtype]}")
    return overrides


def family_backbone(name: str, tiny_bert, tiny_roberta, tiny_llama, tiny_mpnet):
    """A tiny random model of the recipe's architecture family."""
    if "prompteol" in name or "llm2vec" in name or "pcc" in name:
        return tiny_llama
    if "mpnet" in name:
        return tiny_mpnet
    return tiny_roberta if "roberta" in name else tiny_bert


@pytest.mark.parametrize("name", experiment_names())
def test_every_experiment_trains_with_the_cuda_profile(name, probe, tiny_bert, tiny_roberta, tiny_llama, tiny_mpnet,
                                                       real_data_root, tmp_path, triplets_csv, stage_one):
    backbone = family_backbone(name, tiny_bert, tiny_roberta, tiny_llama, tiny_mpnet)
    cfg = compose_train(gpu_command(name, backbone, real_data_root, tmp_path / "out", triplets_csv, stage_one))
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
    trainer = train(checked(cfg))
    assert trainer.state.finished and trainer.global_step == STEPS
    seen = probe.seen
    # the objects a CUDA run builds
    assert seen["profile"].kind == "cuda" and seen["profile"].rehearsal
    assert seen["optimizer"] is torch.optim.AdamW and seen["fused"] is True
    assert seen["plugin"] is MixedPrecision and seen["scaler"] is None and seen["precision"] == "bf16-mixed"
    assert seen["matmuls"] == "tf32" and seen["precision_at_setup"] == TF32_ON
    # after a run that scored its dev set (TF32 off inside each scoring, back on after), every getter still answers
    assert legacy_views() == TF32_ON
    with cuda_device_queries():
        CUDAAccelerator().setup_device(HOPPER)
    assert (seen["workers"], seen["pin_memory"], seen["persistent_workers"]) == (4, True, True)
    # clipped at the recipe's norm: every step the optimiser took saw a gradient norm within it
    clip = cfg.trainer.gradient_clip_val
    assert len(probe.norms) == STEPS and all(torch.isfinite(torch.tensor(probe.norms)))
    if clip:
        assert max(probe.norms) <= clip * (1 + 1e-4), probe.norms
    # the scores say what trained them
    profile = json.loads((tmp_path / "out" / "results.json").read_text())["provenance"]["device_profile"]
    assert profile == {"kind": "cuda", "precision": "bf16-mixed", "tf32_training": True, "compile": False,
                       "evaluation": "float32, TF32 off unless backbone.autocast=bf16", "rehearsal_on_cpu": True,
                       "optimizer_implementation": "fused"}
