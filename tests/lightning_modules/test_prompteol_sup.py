"""PromptEOL supervised LoRA recipe (lightning_modules/prompteol.py) on a tiny random LLaMA built from a config: a few
steps on the local SICK triplets with the CPU experiment's config, adapter-only checkpoints, base identity checks,
merged and adapter exports, gradient caching, and QLoRA refused without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.instantiate import build
from promptemb.encoder.loading import weights_sha256
from promptemb.exporting.runner import export_module
from promptemb.inference.prompt_encoder import load_encoder
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from promptemb.lightning_modules.prompteol import ADAPTER_RECORD, PromptEOLSup, is_adapter_key
from tests.conftest import REPO
from tests.decoder_helpers import SENTENCES, save_tiny_decoder
from tests.helpers import assert_close_scaled, assert_tensors_close

DATA = os.environ.get("PROMPTEMB_DATA")
needs_data = pytest.mark.skipif(not DATA or not os.path.isfile(f"{DATA}/downstream/SICK/SICK_train.txt"),
                                reason="needs the local SICK corpus ($PROMPTEMB_DATA)")
TRIPLETS = [("A man is playing a guitar.", "A man plays music.", "A woman is cooking."),
            ("the sun is shining", "it is sunny", "it is raining at night"),
            ("Stocks fell sharply on Monday", "Shares dropped on Monday", "Stocks rose on Monday"),
            ("two dogs run in a field", "dogs are running outside", "a cat sleeps indoors")]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_decoder(tmp_path_factory.mktemp("llama"), "llama")


def quickstart_config(model_dir, *overrides):
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=quickstart_prompteol_sup",
                                          f"backbone.name_or_path={model_dir}", *overrides])
    return cfg


class LossRecorder(pl.Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


@pytest.fixture(scope="module")
def trained(tiny_llama, tmp_path_factory):
    """The CPU experiment's module and data (its config, composed as train.py composes it), 12 steps."""
    cfg = quickstart_config(tiny_llama)
    pl.seed_everything(0)
    module = build(cfg.model, optimizer=build(cfg.optimizer), scheduler=build(cfg.scheduler))
    datamodule = build(cfg.data)
    recorder = LossRecorder()
    trainer = pl.Trainer(accelerator="cpu", max_steps=12, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder])
    trainer.fit(module, datamodule=datamodule)
    checkpoint = tmp_path_factory.mktemp("ckpt") / "adapter.ckpt"
    trainer.save_checkpoint(checkpoint)
    return module.eval(), recorder.losses, checkpoint


@needs_data
def test_recipe_loss_falls_on_the_local_corpus(trained):
    _, losses, _ = trained
    assert len(losses) == 12 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < losses[0] - 0.2, losses


@needs_data
def test_checkpoint_holds_only_the_adapter_with_base_name_and_hash(trained, tiny_llama):
    module, _, path = trained
    checkpoint = torch.load(path, weights_only=True)
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    assert set(checkpoint["state_dict"]) == trainable and all(is_adapter_key(k) for k in trainable)
    base = type(module.transformer.get_base_model()).from_pretrained(tiny_llama)  # as loaded, adapter-free
    assert checkpoint[ADAPTER_RECORD] == {"base_model": str(tiny_llama), "base_weights_sha256": weights_sha256(base)}
    assert path.stat().st_size < 200_000  # the tiny base alone is ~800 kB


@needs_data
def test_reload_gives_equal_embeddings_and_refuses_another_base(trained, tmp_path):
    module, _, path = trained
    reloaded = load_module_checkpoint(path).module
    # the same weights through the same kernels in this process: the same bits on any CPU
    torch.testing.assert_close(reloaded.embed(SENTENCES), module.embed(SENTENCES), rtol=0, atol=0)
    other = save_tiny_decoder(tmp_path / "other", "llama", seed=1)  # same shapes, different weights
    with pytest.raises(DataError) as caught:
        load_module_checkpoint(path, base_model=str(other))
    assert "\n" not in str(caught.value) and "base weights sha256" in str(caught.value)


@needs_data
def test_training_resumes_from_an_adapter_only_checkpoint(trained, tiny_llama):
    _, _, path = trained
    cfg = quickstart_config(tiny_llama)
    resumed = build(cfg.model, optimizer=build(cfg.optimizer), scheduler=build(cfg.scheduler))
    trainer = pl.Trainer(accelerator="cpu", max_steps=14, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(resumed, datamodule=build(cfg.data), ckpt_path=str(path))
    assert trainer.global_step == 14
    with pytest.raises(RuntimeError, match="16 missing"):  # an empty state dict misses every adapter weight
        resumed.load_state_dict({})


@needs_data
def test_evaluate_scores_an_adapter_checkpoint_as_the_recipe_does(trained):
    """What evaluate.py opens for a LoRA-recipe .ckpt: the module on its recorded base, scored with its own
    evaluation template and last-token pooler (whole sentences, as the training callback scores), giving the
    embeddings of the encode API and of the export."""
    from promptemb.inference.model_sources import open_trained_model
    from promptemb.inference.prompt_encoder import PromptEncoder

    module, _, path = trained
    loaded = load_module_checkpoint(path)
    assert loaded.recipe == "prompteol_sup" and loaded.global_step == 12
    model = open_trained_model(str(path), device="cpu")
    assert model.source["kind"] == "checkpoint" and model.source["checkpoint_sha256"] == loaded.sha256
    assert model.template.text == module.eval_template.text and model.encoder.is_decoder
    embeddings = model.encoder.embed(SENTENCES, model.poolers, model.template, model.sentence_rule)
    expected = PromptEncoder.from_checkpoint(path).encode(SENTENCES, show_progress_bar=False)
    # two float32 forwards of the same weights, batched by two callers: round-off of the embeddings' largest entry
    assert_close_scaled(embeddings[model.poolers[0].name], expected, 1e-5)


@needs_data
def test_module_export_reloads_to_equal_embeddings(trained, tmp_path):
    """`export_module` from Python: the adapter merged (a plain model directory, no LoRA weights) or kept (peft's
    files naming the base), both reloading to the module's embeddings; the module itself stays unmerged."""
    module, _, _ = trained
    expected = module.embed(SENTENCES)
    out = export_module(module, tmp_path / "merged")
    assert not any(is_adapter_key(k) for k in json.loads((out / "config.json").read_text()))
    got = load_encoder(out).encode(SENTENCES, show_progress_bar=False)
    # merged weights W + BA are rounded to float32 once, then a forward of other sums: relative to the largest entry
    assert_close_scaled(got, expected, 1e-5)
    torch.testing.assert_close(module.embed(SENTENCES), expected, rtol=0, atol=0)  # unmerged: same bits, same kernels
    kept = export_module(module, tmp_path / "adapter", adapter="keep")
    adapter_config = json.loads((kept / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["r"] == 8 and adapter_config["base_model_name_or_path"] == module.hparams.model_name_or_path
    assert_close_scaled(load_encoder(kept).encode(SENTENCES, show_progress_bar=False), expected, 1e-5)


def test_gradient_caching_gives_the_full_batch_gradient(tiny_llama):
    def gradients(chunk):
        torch.manual_seed(0)
        module = PromptEOLSup(str(tiny_llama), lora_r=4, lora_dropout=0.0, grad_cache_chunk_size=chunk)
        for name, p in module.named_parameters():  # LoRA B starts at zero: give the adapter something to do
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        loss, _rows, to_backward = module.contrastive_loss(TRIPLETS)
        to_backward(loss).backward()
        return loss.item(), {n: p.grad.clone() for n, p in module.named_parameters() if p.requires_grad}

    plain_loss, plain = gradients(None)
    cached_loss, cached = gradients(1)
    # float32 model, summed in another order per chunk: the loss to 1e-6 of the logits' scale 1/τ = 20 (observed
    # 3.6e-8), every gradient to 1e-5 of its own largest entry, or of the largest gradient (observed 1.2e-6)
    assert_close_scaled(cached_loss, plain_loss, 0.0, atol=1e-6 * 20, msg="loss")
    assert_tensors_close(cached, plain, 1e-5)


def test_encoder_backbone_is_refused_in_one_line(tiny_bert):
    with pytest.raises(ConfigError) as caught:
        PromptEOLSup(str(tiny_bert))
    assert "\n" not in str(caught.value) and "decoder (causal LM)" in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_qlora_without_cuda_is_refused_in_one_line_before_loading(tmp_path):
    with pytest.raises(ConfigError) as caught:  # the model path does not exist: nothing was loaded
        PromptEOLSup(str(tmp_path / "never-read"), quantization="4bit")
    assert "\n" not in str(caught.value) and "needs a CUDA GPU" in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_train_cli_refuses_qlora_without_cuda_with_exit_2(tiny_llama, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    run = subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=quickstart_prompteol_sup",
                          f"backbone.name_or_path={tiny_llama}", "model.quantization=4bit",
                          f"paths.log_dir={tmp_path}"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2, run.stderr[-2000:]
    assert len(errors) == 1 and "needs a CUDA GPU" in errors[0]
    assert not list(tmp_path.rglob("*.ckpt"))


def test_quickstart_config_resolves_to_the_recipe(tiny_llama):
    cfg = OmegaConf.to_container(quickstart_config(tiny_llama).model, resolve=True)
    assert cfg["_target_"] == "promptemb.lightning_modules.prompteol.PromptEOLSup"
    assert (cfg["temperature"], cfg["max_sentence_tokens"], cfg["quantization"]) == (0.05, 32, None)
