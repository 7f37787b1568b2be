"""Gradient caching and gradient checkpointing give the loss and the parameter gradients of the full batch."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from promptemb.lightning_modules.base import NonFiniteLossError
from promptemb.lightning_modules.grad_cache import RngState, TemplateBiasCache, split_batch
from promptemb.lightning_modules.losses import info_nce
from promptemb.lightning_modules.optiprompt import OptiPrompt
from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup
from tests.conftest import REPO
from tests.helpers import assert_close_scaled, assert_tensors_close, save_tiny_bert
from tests.training.test_ddp import free_port

#: The modules below are float64 but for InfoNCE's fp32 logits (losses.py). Gradient caching, checkpointing and
#: chunking hand InfoNCE the same [N, D] embeddings up to float64 round-off (~1e-16, far below the fp32 rounding of
#: the logits' inputs), so the same fp32 logits, and the loss and every gradient agree to float64 round-off: observed
#: at most 1e-12 of a tensor's largest entry under AVX-512, AVX2 and one thread. TOL is relative to each tensor's
#: largest entry (the loss: to the logits' scale 1/τ), or to the model's largest where a tensor is zero in exact
#: arithmetic (assert_tensors_close), the same on any CPU.
TOL = 1e-9
#: Against a float64 loss (sentence-transformers' MNRL) the fp32 logits' round-off (~1e-7, amplified by 1/τ = 20 on
#: its way back) shows: observed up to 2.6e-6 of a gradient's largest entry and 1e-7 of 1/τ in the loss.
FP32_LOGITS_TOL = 3e-5
LOGIT_SCALE = 1 / 0.05  # 1/τ: every module here trains at the default temperature
SENTENCES = ["a man plays a guitar .", "short", "two dogs run in a field while a plane lands at night",
             "a woman is slicing onions", "the sun is shining", "a child reads a book on the sofa",
             "stocks fell sharply on monday .", "short"]  # a duplicate length and a duplicate sentence
TRIPLETS = [("a man plays a guitar", "a person plays music", "nobody plays anything"),
            ("a dog runs outside", "an animal is moving", "the dog sleeps"),
            ("two kids are eating", "children eat food", "the kids are starving"),
            ("a woman slices onions", "someone cuts vegetables", "a woman is sleeping"),
            ("the sun is shining", "it is a sunny day", "it is raining")]


@pytest.fixture(scope="module")
def tiny_bert_dropout(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_dropout"), dropout=0.1)


def make(kind: str, path, **kwargs):
    torch.manual_seed(0)
    module = {"unsup": PromptBERTUnsup, "sup": PromptBERTSup, "opti": OptiPrompt}[kind](str(path), **kwargs)
    return module.double().train()  # float64 but for InfoNCE's fp32 logits (see TOL)


def loss_and_grads(module, batch, seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """What Lightning back-propagates for one training step, and the gradient it leaves on every parameter."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss, _, to_backward = module.contrastive_loss(batch)
    to_backward(loss).backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
    # every trainable parameter got gradient, but the head's LayerNorm bias, which cancels in g(h) - g(bias)
    assert grads and all(g.abs().sum() > 0 for n, g in grads.items() if n != "head.layer_norm.bias")
    return loss.detach(), grads


def assert_same_loss(got, reference, tol=TOL):
    """The loss of fp32 logits cos/τ: round-off to `tol` of their scale 1/τ, not of the loss."""
    assert_close_scaled(got, reference, 0.0, atol=tol * LOGIT_SCALE, msg="loss")


def assert_same(got, reference, tol=TOL):
    assert_same_loss(got[0], reference[0], tol)
    assert_tensors_close(got[1], reference[1], tol)


def chunked_with_graph(module, batch, size, seed: int = 1):
    """Pass 1 with plain autograd (graph kept through every chunk and every template bias), then one backward:
    the full-batch loss and gradient of exactly the computation gradient caching splits in two passes."""
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    cache = TemplateBiasCache(module.device, keep_graph=True)
    module.template_bias_cache = cache
    views = []
    for index, chunk in enumerate(split_batch(batch, size)):
        cache.start_chunk(index)
        views.append(module.contrastive_views(chunk))
    module.template_bias_cache = None
    columns = [None if column[0] is None else torch.cat(column) for column in zip(*views, strict=True)]
    loss = info_nce(*columns[:2], module.hparams.temperature, columns[2])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("kind", "batch", "options", "chunk"), [
    ("unsup", SENTENCES, {}, 3),  # two templates, template denoising of both views; a last chunk of 2
    ("unsup", SENTENCES, {}, 1),
    ("unsup", SENTENCES, {"freeze_bias": True}, 3),
    ("sup", TRIPLETS, {}, 2),  # hard negatives, MLM-transform head on sentence and bias
    ("opti", SENTENCES, {"denoise": True}, 3),  # soft template; two pooled calls per chunk, each with its own bias
])
def test_grad_cache_equals_full_batch_without_dropout(tiny_bert, kind, batch, options, chunk):
    """Deterministic forward (no dropout): the cached step equals the ordinary single-forward step."""
    reference = loss_and_grads(make(kind, tiny_bert, **options), batch)
    got = loss_and_grads(make(kind, tiny_bert, grad_cache_chunk_size=chunk, **options), batch)
    assert_same(got, reference)


@pytest.mark.parametrize(("kind", "batch"), [("unsup", SENTENCES), ("sup", TRIPLETS)])
def test_grad_cache_replays_dropout(tiny_bert_dropout, kind, batch):
    """Dropout on: the two passes give the loss and gradients of the chunked forward back-propagated with plain
    autograd (same dropout masks, each bias forward once); without the RNG replay the gradients are different."""
    module = make(kind, tiny_bert_dropout, grad_cache_chunk_size=3)
    reference = chunked_with_graph(module, batch, 3)
    got = loss_and_grads(module, batch)
    assert_same(got, reference)
    assert module.transformer.config.hidden_dropout_prob > 0 and module.training  # dropout really is on

    restore = RngState.restore
    RngState.restore = lambda self: None
    try:
        unreplayed = loss_and_grads(module, batch)
    finally:
        RngState.restore = restore
    assert_same_loss(unreplayed[0], reference[0])  # same pass 1 ...
    assert max((unreplayed[1][n] - reference[1][n]).abs().max() for n in reference[1]) > 1e-3  # ... wrong pass 2


def test_grad_cache_bias_forwards_cover_each_length_once(tiny_bert):
    module = make("unsup", tiny_bert, grad_cache_chunk_size=3)
    from promptemb.lightning_modules.grad_cache import GradCache

    step = GradCache(module, 3)
    step.loss(SENTENCES)
    lengths = [module.builders[0].build([s])[0].sentence_length for s in SENTENCES]
    computed = sorted(n for forward in step.cache.forwards for n in forward.lengths[0].tolist())
    assert computed == sorted(set(lengths))  # first view: every distinct length once, over all chunks
    assert len(step.cache.forwards) <= len(step.chunks)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tiny_bert_dropout):
    plain = make("unsup", tiny_bert_dropout)
    checkpointed = make("unsup", tiny_bert_dropout, gradient_checkpointing=True)
    calls = []
    checkpointed.transformer.encoder.layer[0].attention.register_forward_hook(lambda *args: calls.append(1))
    assert_same(loss_and_grads(checkpointed, SENTENCES), loss_and_grads(plain, SENTENCES))
    assert len(calls) == 2  # one forward (views and biases), recomputed in backward: checkpointing is on
    cached = make("unsup", tiny_bert_dropout, gradient_checkpointing=True, grad_cache_chunk_size=3)
    plain_cached = make("unsup", tiny_bert_dropout, grad_cache_chunk_size=3)
    assert_same(loss_and_grads(cached, SENTENCES), loss_and_grads(plain_cached, SENTENCES))


def test_split_batch_along_examples():
    assert split_batch(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
    ids = torch.arange(10).view(5, 2)
    parts = split_batch({"ids": ids, "lengths": torch.arange(5)}, 2)
    assert [p["ids"].shape[0] for p in parts] == [2, 2, 1] and parts[2]["lengths"].tolist() == [4]


def fit_one_step(module, batch, clip: float) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=clip)
    trainer.fit(module, DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
    return {name: p.detach().clone() for name, p in module.named_parameters()}


@pytest.mark.parametrize("kind", ["unsup", "sup"])
def test_lightning_step_with_grad_cache_equals_the_plain_step(tiny_bert, kind):
    """Through Lightning: optimiser, LR schedule and gradient clipping (active at this max norm) see the same
    gradients, so one step moves every parameter to the same place."""
    batch = SENTENCES if kind == "unsup" else TRIPLETS
    options = {"optimizer": functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.0)}
    plain = fit_one_step(make(kind, tiny_bert, **options), batch, clip=0.05)
    start = {n: p.detach().clone() for n, p in make(kind, tiny_bert, **options).named_parameters()}
    cached = fit_one_step(make(kind, tiny_bert, grad_cache_chunk_size=3, **options), batch, clip=0.05)
    assert max((plain[n] - start[n]).abs().max() for n in plain) > 1e-4  # the step moved the weights
    assert_tensors_close(cached, plain, TOL)


def test_non_finite_loss_stops_before_pass_two_and_the_optimiser_step(tiny_bert, monkeypatch):
    import promptemb.lightning_modules.base as base  # the loss of the cached views (`contrastive_objective`)

    monkeypatch.setattr(base, "info_nce", lambda *args, **kwargs: torch.tensor(float("nan"), requires_grad=True))
    module = make("unsup", tiny_bert, grad_cache_chunk_size=3)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 0; stopped before the optimiser step"):
        fit_one_step(module, SENTENCES, clip=1.0)
    assert all(torch.equal(p, before[n]) for n, p in module.named_parameters())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["unsup", "sup"])
def test_grad_cache_under_two_rank_ddp_equals_one_process_on_the_joined_batch(tiny_bert, tmp_path, kind):
    """2 gloo ranks, gradient caching in chunks of 3 over 4 local sentences (sup: 1 of 2 triplets), gathered
    negatives, real DistributedDataParallel gradient averaging: the loss and every gradient of one ordinary
    process on the joined batch."""
    worker, out = str(REPO / "tests" / "grad_cache_ddp_worker.py"), str(tmp_path / "result")
    env = {**os.environ, "TINY_BERT": str(tiny_bert)}
    chunk = 3 if kind == "unsup" else 1
    subprocess.run([sys.executable, worker, kind, "0", "1", "0", "0", f"{out}-single"], check=True, timeout=300,
                   env=env)
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, worker, kind, str(r), "2", str(port), str(chunk), f"{out}-ddp"],
                              env=env) for r in range(2)]
    assert [p.wait(timeout=300) for p in ranks] == [0, 0]
    single = torch.load(f"{out}-single.0")
    for rank in range(2):
        assert_same(tuple(torch.load(f"{out}-ddp.{rank}").values()), tuple(single.values()))
