"""The poolers and transforms of Stankevičius & Lukoševičius (2024) against plain loop re-computations: token
weighting over the templated input, templated average without [MASK], the Random Embeddings baseline, the Avg.
static model and BERT+Avg., quantile transform to a normal distribution, Pearson next to Spearman."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm
from sklearn.preprocessing import QuantileTransformer

from promptemb.common.errors import ConfigError
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.sts import pearson_x100
from promptemb.poolers import build_pooler
from promptemb.poolers.remove_biases import BERT_UNCASED_TOP36
from promptemb.postprocessing import build_post
from tests.helpers import assert_close_scaled
from tests.oracles import sbert_wk_sentence_loop

#: The library's padded, batched float32 forward against an unpadded eager one (other kernels, other summation
#: order on each CPU), pooled here in float64: every embedding to FORWARD_TOL of its largest entry (observed at most
#: 2.8e-7 under AVX-512, AVX2 and one thread).
FORWARD_TOL = 1e-5
#: SBERT-WK weighs each token by ratios of differences between its layers (alignment, novelty, variance), which
#: amplify the hidden states' round-off about tenfold (observed up to 3.5e-6 of the largest entry).
SBERT_WK_TOL = 1e-4
PROMPT = 'This sentence : "[X]" means [MASK] .'
SENTENCES = ["a man is playing a guitar .", "hi", "the quick brown fox jumps over the lazy dog near the river bank"]
CORPUS = ["a dog runs", "a cat sleeps", "the dog sleeps .", "a man is playing"]


def loop_weighted_mean(vectors, weights):
    total, norm_ = np.zeros_like(vectors[0]), 0.0
    for vector, weight in zip(vectors, weights):
        total += weight * vector
        norm_ += weight
    return total / norm_


def test_templated_average_with_and_without_mask(encoder, reference):
    got = encoder.embed(SENTENCES, [build_pooler("avg"), build_pooler("avg_no_mask")], Template(PROMPT))
    mask_id = encoder.tokenizer.mask_token_id
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, _ = reference[2](PROMPT.replace("[X]", sentence))
        with_mask = loop_weighted_mean([hidden[-1][t] for t in range(len(ids))], [1.0] * len(ids))
        without = loop_weighted_mean([hidden[-1][t] for t in range(len(ids)) if ids[t] != mask_id],
                                     [1.0] * (len(ids) - 1))
        assert_close_scaled(got["avg"][row], with_mask, FORWARD_TOL)
        assert_close_scaled(got["avg_no_mask"][row], without, FORWARD_TOL)
    assert not np.allclose(got["avg"], got["avg_no_mask"])
    with pytest.raises(ConfigError, match="include_mask=false needs templated=true"):
        build_pooler("mean", include_mask=False)


@pytest.mark.parametrize("include_mask", [True, False])
def test_idf_over_templated_input(encoder, reference, include_mask):
    pooler = build_pooler("avg_idf", include_mask=include_mask).fit("mini", CORPUS, encoder.tokenizer)
    got = encoder.embed(SENTENCES, [pooler], Template(PROMPT))["avg_idf"]
    documents = [set(encoder.tokenizer(sentence)["input_ids"]) for sentence in CORPUS]
    mask_id = encoder.tokenizer.mask_token_id

    def hand_idf(token_id: int) -> float:  # the plain corpus' document frequencies; unseen tokens count once
        return math.log(len(documents) / max(1, sum(token_id in document for document in documents)))

    assert hand_idf(mask_id) == pytest.approx(math.log(len(CORPUS)))
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, _ = reference[2](PROMPT.replace("[X]", sentence))
        kept = [t for t in range(len(ids)) if include_mask or ids[t] != mask_id]
        want = loop_weighted_mean([hidden[-1][t] for t in kept], [hand_idf(ids[t]) for t in kept])
        assert_close_scaled(got[row], want, FORWARD_TOL)
    assert pooler.describe()["input"] == "templated"


def test_remove_biases_over_templated_input(encoder, reference):
    got = encoder.embed(SENTENCES, [build_pooler("avg_remove_biases")], Template(PROMPT))["avg_remove_biases"]
    tokenizer = reference[1]
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, _ = reference[2](PROMPT.replace("[X]", sentence))
        tokens = tokenizer.convert_ids_to_tokens(ids)
        kept = [t for t, tok in enumerate(tokens) if tok not in BERT_UNCASED_TOP36 and not tok.startswith("##")
                and any(ch.isalnum() for ch in tok) and tok not in ("[CLS]", "[SEP]", "[MASK]")]
        assert "sentence" in [tokens[t] for t in kept]  # template words are filtered like sentence words
        want = loop_weighted_mean([hidden[-1][t] for t in kept], [1.0] * len(kept))
        assert_close_scaled(got[row], want, FORWARD_TOL)


def test_ditto_over_templated_input(tiny_bert, reference):
    eager = Encoder(str(tiny_bert), batch_size=2, attentions=True, progress=False)
    got = eager.embed(SENTENCES, [build_pooler("ditto", layer=1, head=2, templated=True)], Template(PROMPT))["ditto"]
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, attentions = reference[2](PROMPT.replace("[X]", sentence))
        want = sum(attentions[1][2, i, i] * (hidden[0][i] + hidden[-1][i]) / 2 for i in range(len(ids)))
        assert_close_scaled(got[row], want, FORWARD_TOL)


def test_random_embeddings_baseline(encoder):
    got = encoder.embed(SENTENCES, [build_pooler("random", seed=3)])["random"]
    table = torch.randn(len(encoder.tokenizer), encoder.hidden_size, generator=torch.Generator().manual_seed(3))
    for row, sentence in enumerate(SENTENCES):
        ids = encoder.tokenizer(sentence)["input_ids"]
        want = loop_weighted_mean([table[i].double().numpy() for i in ids], [1.0] * len(ids))
        assert_close_scaled(got[row], want, FORWARD_TOL)  # a float32 mean of table rows
    before = encoder.stats.forward_sequences
    again = encoder.embed(SENTENCES, [build_pooler("random", seed=3)])["random"]
    np.testing.assert_array_equal(got, again)
    assert encoder.stats.forward_sequences == before  # no transformer layer ran
    wide = encoder.embed(SENTENCES, [build_pooler("random", dim=7)])["random"]
    assert wide.shape == (len(SENTENCES), 7)


def test_token_average_static_model_and_bert_mix(encoder, reference):
    ids_of = {}
    for sentence in CORPUS:
        ids, hidden, _ = reference[2](sentence)
        for t, token in enumerate(ids):
            ids_of.setdefault(token, []).append((hidden[0][t] + hidden[-1][t]) / 2)
    table = {token: loop_weighted_mean(states, [1.0] * len(states)) for token, states in ids_of.items()}
    static = build_pooler("token_avg", corpus="file:x", layers=[0, -1])
    mixed = build_pooler("bert_token_avg", corpus="file:x", layers=[0, -1], weight=0.25)
    encoder.check_poolers([static, mixed], None)  # binds the encoder whose forward builds the table
    before = encoder.stats.forward_sequences
    static.fit("file:x", CORPUS, encoder.tokenizer)
    mixed.fit("file:x", CORPUS, encoder.tokenizer)
    assert encoder.stats.forward_sequences - before == len(CORPUS)  # one fit pass serves both poolers
    sentences = ["a dog sleeps", "a man runs !", "zebra"]  # "!" and "zebra" never occur in the corpus
    got = encoder.embed(sentences, [static, mixed])
    for row, sentence in enumerate(sentences):
        ids, hidden, _ = reference[2](sentence)
        seen = [i for i in ids if i in table]
        want_static = loop_weighted_mean([table[i] for i in seen], [1.0] * len(seen))
        assert_close_scaled(got["token_avg"][row], want_static, FORWARD_TOL)
        contextual = loop_weighted_mean([(hidden[0][t] + hidden[-1][t]) / 2 for t in range(len(ids))],
                                        [1.0] * len(ids))
        assert_close_scaled(got["bert_token_avg"][row], 0.75 * contextual + 0.25 * want_static, FORWARD_TOL)
    assert static.describe()["vocabulary_seen"] == len(table)
    assert static.label == "token_avg(file:x)"


def test_token_average_needs_a_named_corpus():
    with pytest.raises(ConfigError, match=r"needs a named corpus .* pooler_args.token_avg.corpus=W"):
        build_pooler("token_avg")
    with pytest.raises(ConfigError, match="needs a named corpus"):
        build_pooler("bert_token_avg", corpus="T")
    with pytest.raises(ConfigError, match=r"weight must be in \[0, 1\]"):
        build_pooler("bert_token_avg", corpus="W", weight=2)


def test_quantile_normal_equals_sklearn_and_normal_quantiles():
    rng = np.random.default_rng(0)
    fit, other = rng.normal(size=(40, 5)) ** 3, rng.normal(size=(7, 5)) ** 3
    post = build_post("quantile_n").fit("T", fit)
    want = QuantileTransformer(n_quantiles=40, output_distribution="normal", subsample=None).fit(fit).transform(other)
    np.testing.assert_array_equal(post.transform(other), want)
    assert post.label == "quantile_n(T)" and post.describe()["output_distribution"] == "normal"
    on_fit = post.transform(fit)
    for d in range(fit.shape[1]):  # interior fit points land on Φ⁻¹ of their empirical CDF rank
        ranks = np.argsort(np.argsort(fit[:, d])) / (len(fit) - 1)
        interior = (ranks > 0) & (ranks < 1)
        np.testing.assert_allclose(on_fit[interior, d], norm.ppf(ranks[interior]), atol=1e-7)
    with pytest.raises(ConfigError, match="output_distribution 'gamma' is unknown"):
        build_post("quantile_u", output_distribution="gamma")


def test_pearson_is_the_plain_formula():
    x, y = np.array([0.1, 0.5, 0.2, 0.9, 0.7]), np.array([1.0, 3.0, 2.5, 4.0, 4.5])
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    want = 100 * cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))
    assert pearson_x100(x, y) == pytest.approx(want, rel=1e-12)


def test_sbert_wk_over_templated_input(encoder, reference):
    got = encoder.embed(SENTENCES, [build_pooler("sbert_wk", layer_start=0, templated=True)], Template(PROMPT))
    for row, sentence in enumerate(SENTENCES):
        ids, hidden, _ = reference[2](PROMPT.replace("[X]", sentence))
        features = np.stack(hidden)[:, : len(ids) - 1]  # all templated tokens but the last ([SEP])
        assert_close_scaled(got["sbert_wk"][row], sbert_wk_sentence_loop(features, 2), SBERT_WK_TOL)
