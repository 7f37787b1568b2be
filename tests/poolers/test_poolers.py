"""Every pooler against a plain per-sentence, per-token loop on an unpadded forward of an independently loaded model."""

import numpy as np
import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.model import Encoder
from promptemb.encoder.outputs import normalize_layer
from promptemb.encoder.template import Template
from promptemb.poolers import build_pooler, build_poolers
from tests.helpers import assert_close_scaled

#: The library's padded, batched float32 forward against an unpadded eager one (other kernels, other summation
#: order on each CPU): every embedding to FORWARD_TOL of its largest entry (observed at most 1.4e-7 under AVX-512,
#: AVX2 and one thread).
FORWARD_TOL = 1e-5
PROMPT = 'This sentence : "[X]" means [MASK] .'
TWO_MASKS = 'This sentence : "[X]" means [MASK] [MASK] .'
SENTENCES = ["a man is playing a guitar .", "hi", "the quick brown fox jumps over the lazy dog near the river bank"]
#: Poolers averaging tokens uniformly; the weighted ones (ditto, sbert_wk, idf, ...) are in test_poolers_weighted.py.
UNWEIGHTED = ("cls", "mean", "first_last", "avg", "static", "mask")


def loop_mean(vectors):
    total = np.zeros_like(vectors[0])
    for vector in vectors:
        total += vector
    return total / len(vectors)


def expected(name, sentence, reference, template=PROMPT):
    model, tokenizer, run = reference
    if name in ("mask", "avg"):
        ids, hidden, _ = run(template.replace("[X]", sentence))
    else:
        ids, hidden, _ = run(sentence)
    last = len(hidden) - 1
    if name == "cls":
        return hidden[last][0]
    if name == "mean":
        return loop_mean([hidden[last][t] for t in range(len(ids))])
    if name == "first_last":
        return loop_mean([(hidden[1][t] + hidden[last][t]) / 2 for t in range(len(ids))])
    if name == "avg":
        return loop_mean([hidden[last][t] for t in range(len(ids))])
    if name == "mask":
        return loop_mean([hidden[last][t] for t in range(len(ids)) if ids[t] == tokenizer.mask_token_id])
    if name == "static":
        table = model.get_input_embeddings().weight.detach().double().numpy()
        return loop_mean([table[i] for i in ids])
    raise AssertionError(name)


@pytest.mark.parametrize("name", UNWEIGHTED)
def test_pooler_matches_loop(name, encoder, reference):
    pooler = build_pooler(name)
    out = encoder.embed(SENTENCES, [pooler], Template(PROMPT))[name]
    assert out.shape == (len(SENTENCES), encoder.hidden_size) and out.dtype == np.float32
    for row, sentence in enumerate(SENTENCES):
        assert_close_scaled(out[row], expected(name, sentence, reference), FORWARD_TOL)


def test_multi_mask_averages_mask_states(encoder, reference):
    out = encoder.embed(SENTENCES, [build_pooler("mask")], Template(TWO_MASKS))["mask"]
    for row, sentence in enumerate(SENTENCES):
        assert_close_scaled(out[row], expected("mask", sentence, reference, TWO_MASKS), FORWARD_TOL)


def test_layer_indexing(encoder, reference):
    """Layer 0 is the embedding output (word + position + segment, LayerNorm); -1 is the last layer L."""
    model, tokenizer, _ = reference
    poolers = [build_pooler("mean", layers=[0]), ]
    emb0 = encoder.embed(SENTENCES, poolers)["mean"]
    for row, sentence in enumerate(SENTENCES):
        ids = torch.tensor([tokenizer(sentence)["input_ids"]])
        with torch.no_grad():
            direct = model.embeddings(input_ids=ids)[0].double().numpy()
        assert_close_scaled(emb0[row], direct.mean(0), FORWARD_TOL)
    last = encoder.embed(SENTENCES, [build_pooler("mean", layers=[encoder.num_layers])])["mean"]
    # layer L is layer -1: the same forward through the same kernels in this process, so the same bits on any CPU
    np.testing.assert_array_equal(last, encoder.embed(SENTENCES, [build_pooler("mean")])["mean"])
    multi = encoder.embed(SENTENCES, [build_pooler("first_last", layers=[0, 1, -1])])["first_last"]
    _, _, run = reference
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, _ = run(sentence)
        want = loop_mean([(hidden[0][t] + hidden[1][t] + hidden[-1][t]) / 3 for t in range(len(ids))])
        assert_close_scaled(multi[row], want, FORWARD_TOL)


def test_normalize_layer_bounds():
    assert normalize_layer(0, 12) == 0 and normalize_layer(-1, 12) == 12 and normalize_layer(-13, 12) == 0
    with pytest.raises(ConfigError, match="layer 13 is out of range for a model with 12 layers"):
        normalize_layer(13, 12)


def test_out_of_range_layer_fails_before_forward(encoder):
    with pytest.raises(ConfigError, match="out of range"):
        encoder.embed(["x"], [build_pooler("mean", layers=[7])])
    assert encoder.stats.forward_batches >= 0


def test_order_and_batch_size_do_not_change_embeddings(tiny_bert, encoder):
    poolers = build_poolers(["mean", "mask"])
    a = encoder.embed(SENTENCES, poolers, Template(PROMPT))
    big = Encoder(str(tiny_bert), batch_size=64, progress=False)
    b = big.embed(SENTENCES[::-1], poolers, Template(PROMPT))
    for name in a:
        assert_close_scaled(a[name], b[name][::-1], FORWARD_TOL, msg=name)


def test_registry_errors():
    with pytest.raises(ConfigError, match=r"unknown pooler 'nope'; all \d+ are listed in docs/reference\.md"):
        build_pooler("nope")
    with pytest.raises(ConfigError, match="pooler_args given for avg"):
        build_poolers(["mean"], {"avg": {}})
    with pytest.raises(ConfigError, match=r"^pooler_args\.mask\.layers is not an argument of the pooler 'mask'; did "
                                          r"you mean pooler_args\.mask\.layer\?$"):
        build_pooler("mask", layers=[1])


def test_mask_pooling_errors(encoder, tiny_bert_no_mask):
    with pytest.raises(ConfigError, match=r"needs a \[MASK\] in the template"):
        encoder.embed(["x"], [build_pooler("mask")], Template('This sentence : "[X]" .'))
    with pytest.raises(ConfigError, match="pass a template"):
        encoder.embed(["x"], [build_pooler("avg")], None)
    no_mask = Encoder(str(tiny_bert_no_mask), progress=False)
    with pytest.raises(ConfigError, match=r"needs a \[MASK\] token but model .* has none"):
        no_mask.embed(["x"], [build_pooler("mask")], Template(PROMPT))
