"""Ditto, SBERT-WK, idf, remove-biases and top-k MLM poolers against plain loop re-computations."""

import math

import numpy as np
import pytest
import torch
from transformers import BertForMaskedLM

from promptemb.common.errors import ConfigError
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.poolers import build_pooler
from promptemb.poolers.remove_biases import BERT_UNCASED_TOP36
from promptemb.poolers.sbert_wk import layer_weights, r_factors, sbert_wk_embed, window_layers
from tests.helpers import assert_close_scaled
from tests.oracles import sbert_wk_sentence_loop, sbert_wk_token_loop

#: The library's padded, batched float32 forward against an unpadded eager one (other kernels, other summation
#: order on each CPU), pooled here in float64: every embedding to FORWARD_TOL of its largest entry (observed at most
#: 2.8e-7 under AVX-512, AVX2 and one thread).
FORWARD_TOL = 1e-5
#: SBERT-WK weighs each token by ratios of differences between its layers (alignment, novelty, variance), which
#: amplify the hidden states' round-off about tenfold (observed up to 3.5e-6 of the largest entry).
SBERT_WK_TOL = 1e-4
SENTENCES = ["a man is playing a guitar .", "hi", "the quick brown fox jumps over the lazy dog near the river bank",
             "A man , a dog !"]
PROMPT = 'This sentence : "[X]" means [MASK] .'


@pytest.fixture(scope="module")
def eager(tiny_bert):
    return Encoder(str(tiny_bert), batch_size=3, attentions=True, progress=False)


def test_ditto_matches_token_loop(eager, reference):
    pooler = build_pooler("ditto", layer=1, head=2)
    got = eager.embed(SENTENCES, [pooler])["ditto"]
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, attentions = reference[2](sentence)
        want = np.zeros(hidden[0].shape[1])
        for i in range(len(ids)):
            want += attentions[1][2, i, i] * (hidden[0][i] + hidden[-1][i]) / 2  # not normalised
        assert_close_scaled(got[row], want, FORWARD_TOL)


def test_ditto_errors(eager, tiny_bert):
    with pytest.raises(ConfigError, match=r"ditto layer 0 / head 4 is out of range .* 3 layers x 4 heads"):
        eager.embed(["x"], [build_pooler("ditto", layer=0, head=4)])
    with pytest.raises(ConfigError, match=r"ditto layer 3 / head 0 is out of range"):
        eager.embed(["x"], [build_pooler("ditto", layer=3, head=0)])
    sdpa = Encoder(str(tiny_bert), progress=False)
    with pytest.raises(ConfigError, match="needs attention probabilities"):
        sdpa.embed(["x"], [build_pooler("ditto", layer=0, head=0)])


def test_model_that_returns_no_attentions_is_a_config_error(eager, monkeypatch):
    original = eager.transformer.forward

    def without_attentions(*args, **kwargs):
        out = original(*args, **kwargs)
        out.attentions = None
        return out

    monkeypatch.setattr(eager.transformer, "forward", without_attentions)
    with pytest.raises(ConfigError, match="returned no attention probabilities"):
        eager.embed(["x"], [build_pooler("ditto", layer=0, head=0)])


def test_window_layers_follow_python_slicing():
    assert window_layers(0, 5, 2) == [1, 2, 0]
    assert window_layers(1, 5, 2) == [2, 3, 1]  # k < m: the whole left window is dropped, not clipped
    assert window_layers(2, 5, 2) == [0, 1, 3, 4, 2]
    assert window_layers(4, 5, 2) == [2, 3, 4]
    assert window_layers(3, 9, 3) == [0, 1, 2, 4, 5, 6, 3]


@pytest.mark.parametrize("method", ["gram", "qr"])
@pytest.mark.parametrize(("num_layers", "window"), [(6, 2), (4, 3), (3, 1)])
def test_sbert_wk_batched_equals_per_token_loop(method, num_layers, window):
    generator = torch.Generator().manual_seed(num_layers)
    layers = torch.randn(3, num_layers, 7, 16, generator=generator, dtype=torch.float64)
    layers += torch.randn(3, 1, 7, 16, generator=generator, dtype=torch.float64) * 2  # correlated across layers
    lengths = [7, 4, 2]
    tokens = torch.arange(7).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    got = sbert_wk_embed(layers.permute(0, 2, 1, 3), tokens, window, method).numpy()
    for b, n in enumerate(lengths):
        want = sbert_wk_sentence_loop(layers[b, :, :n].numpy(), window)
        np.testing.assert_allclose(got[b], want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("method", ["gram", "qr"])
@pytest.mark.parametrize(("num_layers", "window"), [(6, 2), (4, 3), (3, 1), (3, 5)])
def test_sbert_wk_layer_weights_equal_per_token_loop(method, num_layers, window):
    """alpha_k of every token and layer on its own (not only through the sentence vector), windows clipped at
    both ends (k < m, k > K-1-m, and m > K, where the reference's negative slice start wraps)."""
    generator = torch.Generator().manual_seed(10 + num_layers)
    layers = torch.randn(2, 5, num_layers, 12, generator=generator, dtype=torch.float64)
    layers += torch.randn(2, 5, 1, 12, generator=generator, dtype=torch.float64)
    gram = layers @ layers.transpose(-1, -2)
    got = layer_weights(r_factors(layers, gram, method), num_layers, window).numpy()
    for b in range(2):
        for t in range(5):
            want = sbert_wk_token_loop(layers[b, t].numpy(), window)[1]
            np.testing.assert_allclose(got[b, t], want, rtol=1e-9, atol=1e-12)


def test_sbert_wk_pooler_on_model_outputs(tiny_bert, reference):
    encoder = Encoder(str(tiny_bert), batch_size=3, progress=False)
    got = encoder.embed(SENTENCES, [build_pooler("sbert_wk", layer_start=0)])["sbert_wk"]
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, _ = reference[2](sentence)
        features = np.stack(hidden)[:, : len(ids) - 1]  # layers 0..L, all tokens but the last ([SEP])
        assert_close_scaled(got[row], sbert_wk_sentence_loop(features, 2), SBERT_WK_TOL)
    with pytest.raises(ConfigError, match="sbert_wk needs at least 3 layers"):
        encoder.embed(["x"], [build_pooler("sbert_wk", layer_start=2)])
    with pytest.raises(ConfigError, match="sbert_wk window=4 leaves layer 3 with no neighbouring layer"):
        encoder.embed(["x"], [build_pooler("sbert_wk", layer_start=0, window=4)])  # layers 0..3, window 4


def test_idf_matches_hand_counts(tiny_bert, reference):
    encoder = Encoder(str(tiny_bert), batch_size=2, progress=False)
    corpus = ["a dog runs", "a cat sleeps", "the dog sleeps"]
    pooler = build_pooler("idf").fit("mini", corpus, encoder.tokenizer)
    vocab = encoder.tokenizer.convert_tokens_to_ids
    hand = {"a": math.log(3 / 2), "dog": math.log(3 / 2), "the": math.log(3), "runs": math.log(3),
            "[CLS]": 0.0, "[SEP]": 0.0, "guitar": math.log(3)}  # unseen tokens count as seen once
    for token, value in hand.items():
        assert pooler.idf[vocab(token)].item() == pytest.approx(value)
    assert pooler.label == "idf(mini)" and pooler.describe()["fit_corpus"] == "mini"
    got = encoder.embed(SENTENCES, [pooler])["idf"]
    documents = [set(encoder.tokenizer(sentence)["input_ids"]) for sentence in corpus]

    def hand_idf(token_id: int) -> float:  # document frequency counted here, not read from the pooler
        return math.log(len(documents) / max(1, sum(token_id in document for document in documents)))

    for row, sentence in enumerate(SENTENCES):
        ids, hidden, _ = reference[2](sentence)
        weights = [hand_idf(i) for i in ids]
        want = sum(w * hidden[-1][t] for t, w in enumerate(weights)) / sum(weights)
        assert_close_scaled(got[row], want, FORWARD_TOL)
    with pytest.raises(ConfigError, match="used before it was fitted"):
        encoder.embed(["x"], [build_pooler("idf")])


def test_remove_biases_matches_token_loop(tiny_bert, reference):
    assert len(BERT_UNCASED_TOP36) == 36
    encoder = Encoder(str(tiny_bert), batch_size=3, progress=False)
    poolers = [build_pooler("remove_biases"), build_pooler("remove_biases_contextual")]
    got = encoder.embed([*SENTENCES, "a man ."], poolers)
    for row, sentence in enumerate([*SENTENCES, "a man ."]):
        model, tokenizer, forward = reference
        ids, hidden, _ = forward(sentence)
        tokens = tokenizer.convert_ids_to_tokens(ids)
        kept = [t for t, tok in enumerate(tokens) if tok not in BERT_UNCASED_TOP36 and not tok.startswith("##")
                and not all(not ch.isalnum() for ch in tok) and tok not in ("[CLS]", "[SEP]")]
        if not kept:  # every token biased: fall back to the non-special tokens
            kept = list(range(1, len(ids) - 1))
        table = model.get_input_embeddings().weight.detach().double().numpy()
        assert_close_scaled(got["remove_biases"][row], np.mean([table[ids[t]] for t in kept], 0), FORWARD_TOL)
        assert_close_scaled(got["remove_biases_contextual"][row], np.mean([hidden[-1][t] for t in kept], 0),
                            FORWARD_TOL)


def test_mask_topk_matches_loop(tiny_bert):
    encoder = Encoder(str(tiny_bert), batch_size=2, mlm_head=True, progress=False)
    got = encoder.embed(SENTENCES, [build_pooler("mask_topk", k=5)], Template(PROMPT))["mask_topk"]
    model = BertForMaskedLM.from_pretrained(tiny_bert).eval()
    tokenizer = encoder.tokenizer
    for row, sentence in enumerate(SENTENCES):
        ids = tokenizer(PROMPT.replace("[X]", sentence))["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, ids.index(tokenizer.mask_token_id)].double()
        probs = torch.softmax(logits, -1).numpy()
        table = model.get_input_embeddings().weight.detach().double().numpy()
        top = np.argsort(-probs)[:5]
        want = sum(probs[v] * table[v] for v in top) / sum(probs[v] for v in top)
        assert_close_scaled(got[row], want, FORWARD_TOL)
    plain = Encoder(str(tiny_bert), progress=False)
    with pytest.raises(ConfigError, match="needs the MLM head"):
        plain.embed(["x"], [build_pooler("mask_topk")], Template(PROMPT))


def test_model_that_cannot_load_eager_attention_is_a_config_error(tiny_bert, monkeypatch):
    from transformers import AutoModel as Auto

    def refuse(*args, **kwargs):
        raise ValueError("FancyModel does not support an attention implementation through eager yet")

    monkeypatch.setattr(Auto, "from_pretrained", refuse)
    with pytest.raises(ConfigError, match=r"cannot return attention probabilities \(FancyModel does not support"):
        Encoder(str(tiny_bert), attentions=True, progress=False)
    with pytest.raises(ValueError, match="FancyModel"):  # without attentions, an unrelated ValueError stays one
        Encoder(str(tiny_bert), progress=False)
