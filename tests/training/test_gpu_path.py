"""Code paths that only a GPU run takes, exercised on the CPU by emulating the GPU-only condition (each test says how):
final scoring on the training device, gradient caching under autocast, resuming on fewer devices, ..."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.common.device_profile import (
    DeviceProfile,
    exact_matmuls,
    matmul_precision,
    preserved_matmul_precision,
    set_matmul_precision,
)
from promptemb.common.errors import ConfigError
from promptemb.encoder.outputs import EncoderOutput
from promptemb.lightning_modules import base
from promptemb.lightning_modules.grad_cache import TemplateBiasCache, split_batch
from promptemb.lightning_modules.losses import info_nce
from promptemb.lightning_modules.promptbert import PromptBERTUnsup
from promptemb.poolers.mean import MeanPooler
from promptemb.training import rng_state
from promptemb.training.trainer import Trainer
from tests.common.test_validation import run, train_overrides
from tests.conftest import REPO
from tests.helpers import assert_close_scaled, assert_one_line_error, assert_tensors_close
from tests.lightning_modules.test_grad_cache import SENTENCES
from tests.training.test_ddp import free_port
from tests.training.test_train import WIKI_SAMPLE, checked, compose_train

ACCELERATOR = torch.device("cuda", 0)


class EmulatedAcceleratorModule(pl.LightningModule):
    """A LightningModule that pretends to move: `to(device)` only records the device (a CPU-only machine has no
    second device to move to), and `device` reports it, as Lightning's own device tracking does."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.sent_to: list[torch.device] = []

    def to(self, device, *args, **kwargs):
        self.sent_to.append(torch.device(device))
        self._device = torch.device(device)
        return self

    def cpu(self):
        return self.to("cpu")


def devices_final_scoring_ran_on(module, root_device, tmp_path, monkeypatch) -> list[torch.device]:
    """Run STSEvaluationCallback.on_fit_end for a trainer whose strategy trains on `root_device` (no checkpoint
    selected); the device(s) the module was on when the final scoring ran."""
    callback = STSEvaluationCallback.from_config(output_dir=str(tmp_path), final_tasks=["STSBenchmark"])
    scored_on = []
    monkeypatch.setattr(callback, "_score_final", lambda trainer, scored, checkpoint: scored_on.append(scored.device))
    trainer = SimpleNamespace(checkpoint_callback=SimpleNamespace(best_model_path="", best_model_score=None),
                              interrupted=False, is_global_zero=True, loggers=[], global_step=3,
                              strategy=SimpleNamespace(root_device=root_device))
    callback.on_fit_end(trainer, module)
    return scored_on


def test_final_scoring_runs_on_the_training_device_not_where_teardown_left_the_module(tmp_path, monkeypatch):
    """Lightning's Strategy.teardown() moves the module to the CPU before on_fit_end: the final scoring must move it
    back to the strategy's root device (emulated: a module whose moves are recorded), then return it to the CPU."""
    module = EmulatedAcceleratorModule()
    module.cpu()  # what Strategy.teardown() does before on_fit_end
    assert devices_final_scoring_ran_on(module, ACCELERATOR, tmp_path, monkeypatch) == [ACCELERATOR]
    assert module.device == torch.device("cpu")  # handed back where teardown left it


class PreFixAutocastWeightCache:
    """Autocast's weight cache as torch releases before pytorch#165068 kept it (pytorch#112583), for nn.Linear: the
    first bf16 copy of an fp32 leaf weight in the region is cached whatever the grad mode, so a copy made under
    no_grad (no gradient history) is reused by the grad-enabled forwards that follow. Honours
    `torch.is_autocast_cache_enabled()` and `torch.clear_autocast_cache()`, as the real cache does."""

    def __init__(self, monkeypatch):
        self.copies: dict[int, torch.Tensor] = {}
        self.linear = torch.nn.functional.linear
        clear = torch.clear_autocast_cache
        monkeypatch.setattr(torch.nn.functional, "linear", self.cached_linear)
        monkeypatch.setattr(torch, "clear_autocast_cache", lambda: (self.copies.clear(), clear())[1])

    def cast(self, tensor):
        if tensor is None or not (tensor.is_leaf and tensor.requires_grad and tensor.dtype == torch.float32):
            return tensor
        low = torch.get_autocast_dtype("cpu")
        if not torch.is_autocast_cache_enabled():
            return tensor.to(low)
        if id(tensor) not in self.copies:
            self.copies[id(tensor)] = tensor.to(low)
        return self.copies[id(tensor)]

    def cached_linear(self, input, weight, bias=None):
        if not torch.is_autocast_enabled("cpu"):
            return self.linear(input, weight, bias)
        return self.linear(input.to(torch.get_autocast_dtype("cpu")), self.cast(weight), self.cast(bias))


def bf16_step(module, batch, seed: int = 1, one_graph: bool = False):
    """One training step inside a bf16 autocast region on the module's device, as Lightning's bf16-mixed runs it
    (the backward after the region): (loss, gradients). `one_graph`: the chunked computation with plain autograd
    (tests/lightning_modules/test_grad_cache)."""
    module.zero_grad(set_to_none=True)
    torch.clear_autocast_cache()
    with torch.autocast(module.device.type, dtype=torch.bfloat16):
        if one_graph:
            torch.manual_seed(seed)
            cache = TemplateBiasCache(module.device, keep_graph=True)
            module.template_bias_cache = cache
            views = []
            for index, chunk in enumerate(split_batch(batch, module.hparams.grad_cache_chunk_size)):
                cache.start_chunk(index)
                views.append(module.contrastive_views(chunk))
            module.template_bias_cache = None
            anchors, positives = (torch.cat(column) for column in list(zip(*views, strict=True))[:2])
            loss = info_nce(anchors, positives, module.hparams.temperature)
            to_backward = loss
        else:
            torch.manual_seed(seed)
            loss, _, surrogate = module.contrastive_loss(batch)
            to_backward = surrogate(loss)
    torch.clear_autocast_cache()
    to_backward.backward()
    return loss.detach().float(), {n: p.grad for n, p in module.named_parameters() if p.requires_grad}


def bf16_module(path):
    torch.manual_seed(0)
    return PromptBERTUnsup(str(path), grad_cache_chunk_size=3).float().train()


def test_grad_cache_gives_every_parameter_its_gradient_under_the_pre_fix_autocast_cache(tiny_bert, monkeypatch):
    """Pass 1 embeds all chunks but the last under no_grad inside the autocast region: with the old caching
    behaviour emulated, the weight copies it would cache carry no gradient history and most parameters would get
    none (silently zero through allow_unused=True). The no-grad chunks must not seed the cache."""
    PreFixAutocastWeightCache(monkeypatch)
    module = bf16_module(tiny_bert)
    got = bf16_step(module, SENTENCES)
    reference = bf16_step(bf16_module(tiny_bert), SENTENCES, one_graph=True)
    missing = sorted(name for name, grad in got[1].items() if without_gradient(grad))
    # the last LayerNorm's bias cancels in (sentence - template bias) in both computations
    assert missing == sorted(name for name, grad in reference[1].items() if without_gradient(grad)), (
        f"{len(missing)} of {len(got[1])} parameters got no gradient: {missing}")
    assert_bf16_close(got, reference)


def without_gradient(grad) -> bool:
    return grad is None or not grad.abs().sum() > 0


def assert_bf16_close(got, reference):
    """bf16 keeps 8 mantissa bits and the two computations round differently: per parameter, the two differ from
    an fp32 step about as much as from each other (~6% of the norm for this tiny BERT, far more for the tiniest
    gradients), so they are compared as one vector, whose relative error the bug would push to ~1 (the large
    gradients of the linear layers missing)."""
    torch.testing.assert_close(got[0], reference[0], rtol=1e-3, atol=1e-3)
    assert [n for n, g in got[1].items() if without_gradient(g)] == [
        n for n, g in reference[1].items() if without_gradient(g)]
    flat_got = torch.cat([g.flatten() for g in got[1].values() if g is not None])
    flat_reference = torch.cat([g.flatten() for g in reference[1].values() if g is not None])
    assert (flat_got - flat_reference).norm() <= 0.15 * flat_reference.norm()


def test_grad_cache_equals_the_one_graph_step_under_bf16_autocast(tiny_bert):
    """bf16 autocast on CPU, the real (current) autocast cache: the cached step's loss and gradients are the
    one-graph ones, to bf16 precision."""
    got = bf16_step(bf16_module(tiny_bert), SENTENCES)
    reference = bf16_step(bf16_module(tiny_bert), SENTENCES, one_graph=True)
    assert_bf16_close(got, reference)


class EmulatedCudaGenerators:
    """torch.cuda's generator functions on a machine with `visible` devices (this process on `current`): each
    device's state a distinct byte tensor; naming a device that is not visible raises, as CUDA does."""

    def __init__(self, monkeypatch, visible: int, current: int = 0):
        self.visible, self.current = visible, current
        self.states = {index: torch.full((16,), 10 + index, dtype=torch.uint8) for index in range(visible)}
        for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "current_device",
                     "device_count", "is_available"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.visible

    def current_device(self) -> int:
        return self.current

    def _index(self, device) -> int:
        index = device if isinstance(device, int) else torch.device(device).index
        index = self.current if index is None else index
        if index >= self.visible:
            raise IndexError(f"CUDA device {index} is not visible ({self.visible} visible)")
        return index

    def get_rng_state(self, device="cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set_rng_state(self, new_state, device="cuda") -> None:
        self.states[self._index(device)] = new_state.clone()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(index) for index in range(self.visible)]

    def set_rng_state_all(self, new_states) -> None:
        for index, state in enumerate(new_states):
            self.set_rng_state(state, index)


@pytest.mark.parametrize("visible_on_resume", [1, 2])
def test_rng_state_saved_on_eight_devices_resumes_on_fewer(monkeypatch, visible_on_resume):
    """A checkpoint written by rank 3 of an 8-GPU run (CUDA generators emulated) resumes where 1 or 2 devices are
    visible: each process restores the saved state of its own device onto its own device."""
    EmulatedCudaGenerators(monkeypatch, visible=8, current=3)
    saved = rng_state.capture()
    resumed = EmulatedCudaGenerators(monkeypatch, visible=visible_on_resume, current=visible_on_resume - 1)
    rng_state.restore(saved)
    assert torch.equal(resumed.states[visible_on_resume - 1], torch.full((16,), 13, dtype=torch.uint8))


def test_rng_state_of_checkpoints_with_one_state_per_device_still_restores(monkeypatch):
    """Checkpoints written before hold every visible device's state: a process restores its own device's entry."""
    EmulatedCudaGenerators(monkeypatch, visible=8)
    saved = {**rng_state.capture(), "cuda": [torch.full((16,), 10 + index, dtype=torch.uint8) for index in range(8)]}
    resumed = EmulatedCudaGenerators(monkeypatch, visible=2, current=1)
    rng_state.restore(saved)
    assert torch.equal(resumed.states[1], torch.full((16,), 11, dtype=torch.uint8))


@pytest.mark.parametrize("norm", [3.0, 8.0])
def test_gradient_clipping_under_ddp_clips_what_the_reference_clipped(tiny_bert, monkeypatch, norm):
    """4 ranks (emulated world size): the gradient here is the full-batch one G, the reference (Hugging Face Trainer
    under DDP) clipped the rank average G / 4 at max_grad_norm 1.0. Same clipping factor: the step here is 4 times
    the reference's clipped gradient (AdamW ignores that scale). Before: G was clipped at 1.0 (norm 3: clipped,
    though the reference's 0.75 is not)."""
    monkeypatch.setattr(base, "world_size", lambda: 4)
    module = PromptBERTUnsup(str(tiny_bert))
    module.trainer = pl.Trainer(accelerator="cpu", gradient_clip_val=1.0, logger=False, enable_checkpointing=False)
    params = [p for p in module.parameters() if p.requires_grad]
    torch.manual_seed(0)
    full_batch = [torch.randn_like(p) for p in params]
    scale = norm / torch.cat([g.flatten() for g in full_batch]).norm()
    for parameter, grad in zip(params, full_batch, strict=True):
        parameter.grad = grad * scale
    rank_average = [p.grad / 4 for p in params]  # what DDP leaves on each rank in the reference
    factor = min(1.0, 1.0 / (norm / 4))  # max_grad_norm 1.0 on that
    reference = [g * factor for g in rank_average]
    optimizer = torch.optim.AdamW(params)
    module.configure_gradient_clipping(optimizer, 1.0, "norm")  # as Lightning calls it, after unscaling
    for parameter, clipped in zip(params, reference, strict=True):
        # one clipping factor from a float32 norm of every gradient (summed in the kernel's order) against the
        # exact one: round-off of each tensor's largest entry
        assert_close_scaled(parameter.grad, 4 * clipped, 1e-5)


# -- GPU settings refused before any work, on a machine where they cannot run -----------------------------------


def test_trainer_gpu_without_cuda_is_one_line_before_work(tiny_bert, real_data_root, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the error on a machine without CUDA")
    out = tmp_path / "run"
    overrides = [override for override in train_overrides(tiny_bert, out) if override != "trainer.accelerator=cpu"]
    proc = run("train.py", *overrides, "trainer=gpu", data_root=real_data_root)
    assert_one_line_error(proc, r"^error: trainer\.accelerator=gpu but this machine has no CUDA GPU", out)
    assert "Loading weights" not in proc.stderr


def test_fp16_with_gradient_caching_is_refused_before_work(tiny_bert, real_data_root, tmp_path):
    """fp16's GradScaler never scales the gradients pass 2 back-propagates: the combination is refused by the
    config check, and by the module itself for code that builds its own Trainer."""
    cfg = compose_train(train_overrides(tiny_bert, tmp_path / "run", f"data_root={real_data_root}",
                                        "trainer.precision=16-mixed", "model.grad_cache_chunk_size=2"))
    with pytest.raises(ConfigError, match=r"^trainer\.precision=16-mixed cannot train with "
                                          r"model\.grad_cache_chunk_size=2: .*use trainer\.precision=bf16-mixed"):
        checked(cfg)
    checked(compose_train(train_overrides(tiny_bert, tmp_path / "run", f"data_root={real_data_root}",
                                          "trainer.precision=bf16-mixed", "model.grad_cache_chunk_size=2")))
    module = PromptBERTUnsup(str(tiny_bert), grad_cache_chunk_size=2)
    module._trainer = SimpleNamespace(precision="16-mixed")  # a GPU trainer's (on CPU Lightning turns it into bf16)
    with pytest.raises(ConfigError, match=r"cannot train with model\.grad_cache_chunk_size=2"):
        module.setup("fit")


@pytest.mark.slow
def test_two_rank_ddp_prepares_data_once_and_keeps_one_run_folder(tiny_bert, real_data_root, tmp_path):
    """train.py under 2-process DDP (gloo) with no output_dir and an empty cache: the corpus is pre-tokenized once
    (prepare_data on local rank 0, the other rank waits at Lightning's barrier and reads the cache), and the rank
    Lightning starts writes into rank 0's run folder: exactly one folder, with one status.json."""
    log_dir, cache = tmp_path / "logs", tmp_path / "cache"
    overrides = ["experiment=quickstart_unsup", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                 "trainer.precision=32-true", f"paths.log_dir={log_dir}", f"backbone.name_or_path={tiny_bert}",
                 f"data_root={real_data_root}", "data.download=null", f"data.files=[{WIKI_SAMPLE}]",
                 "data.max_examples=64", "data.batch_size=4", "trainer.max_steps=2", "eval_every_n_steps=2",
                 "callbacks.sts_evaluation.final_tasks=[STSBenchmark]"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PROMPTEMB_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "train.py", *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert len(re.findall(r"pre-tokenizing \d+ examples", output)) == 1, output[-3000:]
    runs = list((log_dir / "quickstart_unsup" / "runs").iterdir())
    assert len(runs) == 1, runs
    assert (runs[0] / "status.json").is_file() and (runs[0] / "results.json").is_file()
    assert sorted(p.name for p in log_dir.rglob("status.json")) == ["status.json"]


# -- fast GPU settings, their switches tested on the CPU ---------------------------------------------------------


def test_tf32_is_on_for_cuda_training_only_and_off_while_scoring():
    with preserved_matmul_precision():
        set_matmul_precision("ieee")
        assert not Trainer(accelerator="cpu", logger=False, enable_checkpointing=False).tf32
        assert matmul_precision() == "ieee"
        assert DeviceProfile("cuda").apply_training_matmul_precision()  # what a CUDA trainer does
        assert matmul_precision() == "tf32"
        with exact_matmuls():  # every scoring forward (Encoder.encode_form)
            assert matmul_precision() == "ieee"
        assert matmul_precision() == "tf32"


def test_scoring_forwards_run_with_tf32_off_after_training_turned_it_on(encoder, monkeypatch):
    seen = []
    forward = encoder.forward
    monkeypatch.setattr(encoder, "forward", lambda *a, **k: (seen.append(matmul_precision()), forward(*a, **k))[1])
    with preserved_matmul_precision():
        set_matmul_precision("tf32")
        encoder.embed(["a man plays", "a dog runs"], [MeanPooler()])
        assert seen and set(seen) == {"ieee"} and matmul_precision() == "tf32"


def test_adamw_implementation_is_chosen_by_the_device_profile():
    adamw = functools.partial(torch.optim.AdamW, lr=1e-5, weight_decay=0.0)
    cuda, cpu = DeviceProfile("cuda", "bf16-mixed", clipping=True), DeviceProfile("cpu")
    assert cuda.optimizer_options(adamw) == {"fused": True}  # bf16: clipped directly, nothing to unscale
    assert cpu.optimizer_options(adamw) == {}
    assert cuda.optimizer_options(functools.partial(torch.optim.AdamW, foreach=True)) == {}
    assert cuda.optimizer_options(functools.partial(torch.optim.SGD, lr=0.1)) == {}
    # fp16's GradScaler must unscale before clipping, which a fused step does inside: foreach then
    assert DeviceProfile("cuda", "16-mixed", clipping=True).optimizer_options(adamw) == {"foreach": True}
    assert DeviceProfile("cuda", "16-mixed", clipping=False).optimizer_options(adamw) == {"fused": True}
    parameter = torch.nn.Parameter(torch.ones(3))
    assert torch.optim.AdamW([parameter], **cuda.optimizer_options(adamw)).defaults["fused"]
    assert cuda.describe(adamw)["optimizer_implementation"] == "fused"


def test_fused_adamw_with_fp16_clipping_is_refused_before_work(tiny_bert, real_data_root, tmp_path):
    out = tmp_path / "run"
    proc = run("train.py", *train_overrides(tiny_bert, out), "trainer.precision=16-mixed",
               "trainer.gradient_clip_val=1.0", "+optimizer.fused=true", data_root=real_data_root)
    assert_one_line_error(proc, r"^error: optimizer\.fused=true unscales the gradients inside its step, but "
                                r"trainer\.precision=16-mixed clips them before it "
                                r"\(trainer\.gradient_clip_val=1\.0\): drop optimizer\.fused", out)


def test_bf16_mixed_clipping_equals_fp32_clipping_of_the_same_gradients(tiny_bert):
    """Under bf16-mixed (no GradScaler) the module clips the gradients itself, exactly as Lightning's 32-bit plugin
    does (clip_grad_norm_ over the optimiser's parameters), also for fused AdamW, which the mixed-precision plugin
    refuses."""
    clipped = {}
    for precision in ("32-true", "bf16-mixed"):
        module = PromptBERTUnsup(str(tiny_bert))
        module.trainer = pl.Trainer(accelerator="cpu", precision=precision, gradient_clip_val=1.0, logger=False,
                                    enable_checkpointing=False)
        params = [p for p in module.parameters() if p.requires_grad]
        torch.manual_seed(0)
        for parameter in params:
            parameter.grad = torch.randn_like(parameter)
        optimizer = torch.optim.AdamW(params, fused=True)
        module.configure_gradient_clipping(optimizer, 1.0, "norm")
        clipped[precision] = torch.cat([p.grad.flatten() for p in params])
    # the same float32 gradients clipped by the same call in this process: the same bits on any CPU
    torch.testing.assert_close(clipped["bf16-mixed"], clipped["32-true"], rtol=0, atol=0)
    assert torch.linalg.vector_norm(clipped["bf16-mixed"]) <= 1.0 + 1e-5


def test_training_backbone_uses_sdpa_attention(tiny_bert):
    module = PromptBERTUnsup(str(tiny_bert))
    assert module.transformer.config._attn_implementation == "sdpa"


def test_compile_where_it_cannot_work_is_one_line_before_work(tiny_bert, real_data_root, tmp_path):
    """No C++ compiler for Inductor's CPU kernels (emulated: the compiler it looks for does not exist)."""
    from torch._inductor import config as inductor_config

    cfg = compose_train(train_overrides(tiny_bert, tmp_path / "run", f"data_root={real_data_root}",
                                        "trainer.compile=true"))
    with inductor_config.patch({"cpp.cxx": (None, "no-such-c++-compiler")}), pytest.raises(
            ConfigError, match=r"^trainer\.compile=true cannot work on this machine: no C\+\+ compiler for "
                               r"Inductor's CPU kernels \(looked for no-such-c\+\+-compiler\); use "
                               r"trainer\.compile=false$"):
        checked(cfg)
    checked(cfg)  # g++ is here


@pytest.mark.slow
def test_compiled_backbone_trains_to_the_same_weights_on_cpu(tiny_bert):
    """trainer.compile=true on a tiny BERT on the CPU: one optimiser step lands where the eager step does (to
    compiled-kernel round-off; plain SGD, whose step is the gradient itself: AdamW's first step is lr·sign(g), which
    round-off flips for near-zero gradients), and the parameter names (checkpoints, exports) are unchanged."""
    batch = SENTENCES

    def one_step(compile: bool):
        torch.manual_seed(0)
        module = PromptBERTUnsup(str(tiny_bert), optimizer=functools.partial(torch.optim.SGD, lr=1.0))
        names = sorted(name for name, _ in module.named_parameters())
        start = {name: p.detach().clone() for name, p in module.named_parameters()}
        trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, compile=compile)
        torch.manual_seed(1)
        trainer.fit(module, DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
        assert sorted(name for name, _ in module.named_parameters()) == names
        return {name: p.detach() - start[name] for name, p in module.named_parameters()}, module

    eager, _ = one_step(False)
    compiled, module = one_step(True)
    assert module.training_call is not None  # the training step's transformer call compiled,
    assert module.transformer._compiled_call_impl is None  # the module itself (evaluation's) left eager
    # the steps (-lr x gradient of a float32 model, InfoNCE's 1/τ = 20 amplifying the fused kernels' round-off), each
    # to 1e-3 of its largest entry or of the largest of all (a gradient summing many tokens' terms that cancel
    # carries round-off of the others' scale): observed up to 7.4e-5 of the largest step (AVX-512, 2 threads)
    assert_tensors_close(compiled, eager, 1e-3)


def test_encoder_compile_where_it_cannot_work_is_one_line_before_loading(tiny_bert, tmp_path):
    """backbone.compile=true: no C++ compiler (emulated as above) and a decoder are refused before the weights load."""
    from torch._inductor import config as inductor_config

    from promptemb.encoder.model import Encoder
    from tests.decoder_helpers import save_tiny_decoder

    with inductor_config.patch({"cpp.cxx": (None, "no-such-c++-compiler")}), pytest.raises(
            ConfigError, match=r"^backbone\.compile=true cannot work on this machine: no C\+\+ compiler for "
                               r"Inductor's CPU kernels \(looked for no-such-c\+\+-compiler\); use "
                               r"backbone\.compile=false$"):
        Encoder(str(tiny_bert), device="cpu", compile=True)
    decoder = save_tiny_decoder(tmp_path / "llama", "llama", layers=2, hidden=32)
    with pytest.raises(ConfigError, match=r"^backbone\.compile=true is for encoder models; decoders run uncompiled: "
                                          r"use backbone\.compile=false$"):
        Encoder(str(decoder), device="cpu", compile=True)


@pytest.mark.slow  # Inductor compiles two graphs (padded and unpadded batches): ~40 s on an idle 2-core CPU
def test_compiled_encoder_embeds_what_the_eager_encoder_embeds(tiny_bert):
    """backbone.compile=true (Inductor, dynamic shapes, frozen weights) on a tiny BERT on the CPU: every pooler's
    embeddings equal the eager encoder's to compiled-kernel round-off, over batches of several lengths, padded
    and unpadded."""
    from promptemb.encoder.model import Encoder
    from promptemb.encoder.template import Template
    from promptemb.poolers import build_poolers

    sentences = [" ".join(["word"] * n) + f" {n}" for n in (1, 3, 3, 7, 12, 12, 12, 30)]
    poolers = build_poolers(["mean", "cls", "mask"])
    template = Template("This sentence : \"[X]\" means [MASK] .")
    eager = Encoder(str(tiny_bert), device="cpu", batch_size=3, progress=False)
    compiled = Encoder(str(tiny_bert), device="cpu", batch_size=3, progress=False, compile=True)
    assert compiled.transformer._compiled_call_impl is not None
    expected, got = eager.embed(sentences, poolers, template), compiled.embed(sentences, poolers, template)
    for name in expected:
        assert_close_scaled(got[name], expected[name], 1e-5, msg=name)  # Inductor's fused sums: of the largest


@pytest.mark.slow  # three processes importing torch and Lightning: ~40 s on an idle 2-core CPU
def test_two_nodes_of_one_process_equal_one_process_on_the_joined_batch(tiny_bert, tmp_path):
    """2 nodes x 1 process simulated on localhost: two Lightning DDP processes (gloo), each with the environment a
    node gets from SLURM or torchrun (NODE_RANK, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, LOCAL_RANK=0) and its half of
    the batch, give the loss and every gradient of one process on the joined batch."""
    worker, out = str(REPO / "tests" / "multinode_worker.py"), str(tmp_path / "result")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, worker, str(tiny_bert), "single", f"{out}-single"], check=True, timeout=300,
                   env=env)
    port = str(free_port())
    nodes = [subprocess.Popen([sys.executable, worker, str(tiny_bert), "node", f"{out}-nodes"],
                              env={**env, "NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                                   "WORLD_SIZE": "2", "LOCAL_RANK": "0"}) for node in range(2)]
    assert [process.wait(timeout=300) for process in nodes] == [0, 0]
    single = torch.load(f"{out}-single.0")
    for node in range(2):
        got = torch.load(f"{out}-nodes.{node}")
        # float64 but for InfoNCE's fp32 logits, which every process computes from the same gathered batch with the
        # same kernels on this machine: the same bits; the rest differs by float64 round-off, far inside these bounds
        torch.testing.assert_close(got["loss"], single["loss"], rtol=1e-10, atol=1e-12)
        assert got["grads"].keys() == single["grads"].keys() and single["grads"]
        for name, grad in single["grads"].items():
            torch.testing.assert_close(got["grads"][name], grad, rtol=1e-8, atol=1e-12, msg=name)


def test_scoring_is_float32_by_default_on_every_device(monkeypatch):
    """The default of evaluate.py (every backbone config) and of the training evaluation (`evaluation_encoder` ->
    `Encoder.from_model`) is `none`: float32 forwards on a CUDA device with bf16 too (emulated), so the scores are the
    CPU protocol's; bf16 is an opt-in."""
    import inspect

    from hydra import compose, initialize_config_dir

    from promptemb.encoder.loading import resolve_autocast
    from promptemb.encoder.model import Encoder

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        defaults = {name: compose("eval", overrides=[f"backbone={name}"]).backbone.autocast
                    for name in ("minilm", "bert_base", "roberta_base", "decoder")}
    assert set(defaults.values()) == {"none"}, defaults
    assert inspect.signature(Encoder.from_model).parameters["autocast"].default == "none"
    assert resolve_autocast("none", ACCELERATOR, "float32") is None


def test_evaluation_autocast_is_bf16_on_cuda_only_when_auto(monkeypatch):
    """`autocast=auto` (an opt-in): bf16 on a CUDA device with bf16 (emulated: torch.cuda.is_bf16_supported
    patched), none on the CPU or for bf16 weights; `bf16` forces it."""
    from promptemb.encoder.loading import resolve_autocast

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_autocast("auto", torch.device("cuda", 0), "float32") is torch.bfloat16
    assert resolve_autocast("auto", torch.device("cuda", 0), "bfloat16") is None
    assert resolve_autocast("auto", torch.device("cpu"), "float32") is None
    assert resolve_autocast("none", torch.device("cuda", 0), "float32") is None
    assert resolve_autocast("bf16", torch.device("cpu"), "float32") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert resolve_autocast("auto", torch.device("cuda", 0), "float32") is None
    with pytest.raises(ConfigError, match=r"^unknown autocast 'fp8'; valid: auto, bf16, none$"):
        resolve_autocast("fp8", torch.device("cpu"), "float32")


def test_evaluation_under_bf16_autocast_pools_in_float32(tiny_bert):
    """`autocast=bf16` on the CPU (CPU autocast runs the same bf16 matmuls a GPU would): the transformer's linear
    layers compute in bf16, the states reach the poolers as float32, the embeddings stay close to the fp32 ones,
    and the model description records it."""
    from promptemb.encoder.model import Encoder
    from promptemb.encoder.template import Template
    from promptemb.poolers import build_poolers

    sentences = ["a man is playing a guitar .", "two dogs run", "the cat sleeps on the warm mat today", "hi"]
    poolers = build_poolers(["mean", "mask", "mask_denoised"])
    template = Template('This sentence : "[X]" means [MASK] .')
    exact = Encoder(str(tiny_bert), device="cpu", batch_size=2, progress=False)
    mixed = Encoder(str(tiny_bert), device="cpu", batch_size=2, progress=False, autocast="bf16")
    assert exact.describe()["autocast"] == "none" and mixed.describe()["autocast"] == "bf16"
    seen, pooled = [], []
    dense = mixed.transformer.encoder.layer[0].intermediate.dense
    handle = dense.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    original = EncoderOutput.in_float32

    def spy(self):
        result = original(self)
        pooled.extend(states.dtype for states in result.hidden_states.values())
        return result

    try:
        EncoderOutput.in_float32 = spy
        got = mixed.embed(sentences, poolers, template)
    finally:
        EncoderOutput.in_float32 = original
        handle.remove()
    expected = exact.embed(sentences, poolers, template)
    assert seen and set(seen) == {torch.bfloat16}
    assert pooled and set(pooled) == {torch.float32}
    for name in expected:
        assert got[name].dtype == np.float32
        cosines = (got[name] * expected[name]).sum(1) / (
            np.linalg.norm(got[name], axis=1) * np.linalg.norm(expected[name], axis=1))
        assert cosines.min() > 0.99, (name, cosines)
        assert not np.array_equal(got[name], expected[name])  # bf16 matmuls really ran
