"""The encoder's defaults are its fastest exact path: `parallel_batches` and `onednn_linears` "auto" resolve, per
device, model kind and precision, to two batches at once with oneDNN-packed linears for an encoder on the CPU, and to
the plain path elsewhere; on the CPU the default path embeds what the plain path embeds, for every pooler family, to
float rounding; the packing follows weights that train between two encodings and leaves nothing behind."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from promptemb.encoder.model import (
    AUTO_PARALLEL_BATCHES,
    Encoder,
    InferenceOptions,
    resolve_cpu_speedups,
)
from promptemb.encoder.onednn import PackedLinear, onednn_linears_work
from promptemb.encoder.template import Template
from promptemb.poolers import build_poolers
from tests.encoder.test_encoder import FORWARD_TOL
from tests.helpers import assert_close_scaled

TEMPLATE = Template('This sentence : "[X]" means [MASK] .')
SENTENCES = [" ".join(["word"] * n) + f" {n}" for n in (5, 1, 3, 3, 9, 12, 2, 7, 30, 4, 16)] + [
    "a man is playing a guitar .", "two dogs run in the park", "the cat sits on the mat"]
#: every encoder pooler that needs no fitted corpus: plain and templated inputs, all layers (first_last, sbert_wk),
#: attention probabilities (ditto), the MLM head (mask_topk), the template bias (mask_denoised), the word-embedding
#: table (static, remove_biases)
ENCODER_POOLERS = ["cls", "mean", "first_last", "avg", "avg_no_mask", "static", "mask", "mask_denoised", "mask_topk",
                   "ditto", "sbert_wk", "remove_biases", "remove_biases_contextual", "avg_remove_biases"]
PLAIN = InferenceOptions(parallel_batches=1, onednn_linears=False)

pytestmark = pytest.mark.skipif(not onednn_linears_work(), reason="this torch build has no oneDNN packed linear")


def fast_and_plain(model, **kwargs) -> tuple[Encoder, Encoder]:
    fast = Encoder(str(model), device="cpu", batch_size=3, progress=False, **kwargs)
    plain = Encoder(str(model), device="cpu", batch_size=3, progress=False, parallel_batches=1, onednn_linears=False,
                    **kwargs)
    return fast, plain


def test_auto_resolves_per_device_model_kind_and_precision(tiny_bert, tmp_path, two_threads):
    from tests.decoder_helpers import save_tiny_decoder

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    encoder = {"decoder": False, "dtype": "float32", "autocast": None, "compiled": False}
    assert resolve_cpu_speedups("auto", "auto", device=cpu, **encoder) == (AUTO_PARALLEL_BATCHES, True)
    assert resolve_cpu_speedups("auto", "auto", device=cuda, **encoder) == (1, False)  # a GPU: one batch at a time
    assert resolve_cpu_speedups("auto", "auto", device=cpu, **{**encoder, "decoder": True}) == (1, False)
    assert resolve_cpu_speedups("auto", "auto", device=cpu, **{**encoder, "compiled": True}) == (1, False)
    assert resolve_cpu_speedups("auto", "auto", device=cpu, **{**encoder, "dtype": "bfloat16"}) == (2, False)
    assert resolve_cpu_speedups("auto", "auto", device=cpu, **{**encoder, "autocast": torch.bfloat16}) == (2, False)
    assert resolve_cpu_speedups(3, False, device=cpu, **encoder) == (3, False)  # given values are kept
    torch.set_num_threads(1)
    assert resolve_cpu_speedups("auto", "auto", device=cpu, **encoder) == (1, True)  # no thread to share
    torch.set_num_threads(2)

    fast = Encoder(str(tiny_bert), device="cpu", progress=False)
    assert (fast.parallel_batches, fast.onednn_linears) == (2, True)
    assert {key: fast.describe()[key] for key in ("parallel_batches", "linear_kernels")} == {
        "parallel_batches": 2, "linear_kernels": "onednn_packed"}
    assert not Encoder(str(tiny_bert), device="cpu", progress=False, dtype="bfloat16").onednn_linears
    assert not Encoder(str(tiny_bert), device="cpu", progress=False, autocast="bf16").onednn_linears
    decoder = Encoder(str(save_tiny_decoder(tmp_path / "llama", "llama")), device="cpu", progress=False)
    assert (decoder.parallel_batches, decoder.onednn_linears) == (1, False)  # no refusal: auto is off there
    # a model opened from memory (the training callback, a trained model in evaluate.py) gets the same defaults,
    # and a later call may turn them off again
    in_memory = Encoder.from_model(fast.transformer, fast.tokenizer, name="trained")
    assert (in_memory.parallel_batches, in_memory.onednn_linears) == (2, True)
    in_memory.use_inference_options(PLAIN)
    assert (in_memory.parallel_batches, in_memory.onednn_linears) == (1, False)
    in_memory.device = torch.device("cuda")  # the resolution reads the device only: a GPU run emulated
    in_memory.use_inference_options(InferenceOptions())
    assert (in_memory.parallel_batches, in_memory.onednn_linears) == (1, False)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_default_path_embeds_what_the_plain_path_embeds_for_every_encoder_pooler(tiny_bert, threads):
    """Every encoder pooler family, on one and on two torch threads, against one batch at a time with MKL's linears:
    equal to float rounding (the packed kernel and a thread's share of the batches only reorder float sums)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast, plain = fast_and_plain(tiny_bert, attentions=True, mlm_head=True)
        assert (fast.parallel_batches, fast.onednn_linears) == (threads, True)
        poolers = build_poolers(ENCODER_POOLERS, {"ditto": {"head": 1}, "sbert_wk": {"layer_start": 1}})
        got, expected = fast.embed(SENTENCES, poolers, TEMPLATE), plain.embed(SENTENCES, poolers, TEMPLATE)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert list(got) == ENCODER_POOLERS
    for name in ENCODER_POOLERS:
        assert_close_scaled(got[name], expected[name], FORWARD_TOL, msg=name)


@pytest.mark.parametrize("model", ["tiny_roberta", "tiny_mpnet"])
def test_the_default_path_on_other_encoder_families(model, request, two_threads):
    """RoBERTa (positions from padding_idx + 1) and MPNet, whose relative position bias is patched per forward for the
    template bias's shifted positions: batches in two threads at once, some forwards with explicit positions and some
    without, each gets its own bias."""
    fast, plain = fast_and_plain(request.getfixturevalue(model), attentions=True)
    poolers = build_poolers(["mean", "mask", "mask_denoised", "first_last", "ditto"], {"ditto": {"head": 1}})
    got, expected = fast.embed(SENTENCES, poolers, TEMPLATE), plain.embed(SENTENCES, poolers, TEMPLATE)
    for name in expected:
        assert_close_scaled(got[name], expected[name], FORWARD_TOL, msg=f"{model} {name}")


def test_decoders_keep_the_plain_path(tmp_path, two_threads):
    """The decoder prompt methods hook into the model per call: "auto" is off there, so the default path is the plain
    one, bit for bit."""
    from tests.decoder_helpers import save_tiny_decoder

    path = save_tiny_decoder(tmp_path / "llama", "llama")
    fast, plain = fast_and_plain(path)
    assert (fast.parallel_batches, fast.onednn_linears) == (1, False)
    poolers = build_poolers(["last_token_plain", "prompteol", "pcot", "echo"])
    got, expected = fast.embed(SENTENCES[:6], poolers), plain.embed(SENTENCES[:6], poolers)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def test_weights_trained_between_encodings_are_packed_afresh_and_nothing_is_left_behind(tiny_bert, two_threads,
                                                                                       monkeypatch):
    """A model that trains between two encodings (the training callback's case, though the callback also builds a
    new encoder per evaluation): an encoding packs the weights that changed since the last one (an optimiser step
    moves the version counter of each weight it changes), so the second one embeds what the plain path embeds with
    the new weights, not the old ones, and an encoding of unchanged weights packs nothing; after each encoding the
    model holds its own linears (the same module and parameter objects, trainable: a training step runs on them),
    the torch threads are what they were and no worker thread is left running."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_bert)
    tokenizer = Encoder(str(tiny_bert), device="cpu", progress=False).tokenizer
    fast = Encoder.from_model(model.eval(), tokenizer, name="training", batch_size=3)
    plain = Encoder.from_model(model, tokenizer, name="training", batch_size=3)
    plain.use_inference_options(PLAIN)
    assert (fast.parallel_batches, fast.onednn_linears) == (2, True)
    packed_forwards = []
    original = PackedLinear.forward
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: packed_forwards.append(1) or original(self, x))
    modules, parameters = list(model.modules()), list(model.parameters())
    threads, alive = torch.get_num_threads(), threading.active_count()
    poolers = build_poolers(["mean", "mask"])

    packings = []
    pack = PackedLinear.__init__
    monkeypatch.setattr(PackedLinear, "__init__", lambda self, linear: packings.append(1) or pack(self, linear))
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())

    first = fast.embed(SENTENCES, poolers, TEMPLATE)
    assert packed_forwards and len(packings) == linears  # the packed kernels ran
    assert list(model.modules()) == modules and list(model.parameters()) == parameters
    assert all(type(m) is not PackedLinear for m in model.modules())
    assert torch.get_num_threads() == threads and threading.active_count() == alive
    np.testing.assert_array_equal(fast.embed(SENTENCES, poolers, TEMPLATE)["mean"], first["mean"])
    assert len(packings) == linears  # unchanged weights: the packed copies are reused

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batch = tokenizer(SENTENCES[:4], padding=True, return_tensors="pt")
    model(**batch).last_hidden_state.pow(2).mean().backward()
    optimizer.step()
    model.eval()
    second, expected = fast.embed(SENTENCES, poolers, TEMPLATE), plain.embed(SENTENCES, poolers, TEMPLATE)
    trained = sum(type(m) is torch.nn.Linear and m.weight.grad is not None for m in model.modules())
    assert 0 < trained < linears  # BERT's pooler layer gets no gradient from this loss
    assert len(packings) == linears + trained  # the linears the step changed, packed again
    for name in expected:
        assert_close_scaled(second[name], expected[name], FORWARD_TOL, msg=name)
        assert np.abs(second[name] - first[name]).max() > 100 * FORWARD_TOL * np.abs(first[name]).max()
