"""evaluate_sts with fitted poolers and post-processors: labels, provenance, hand-computed scores, one forward."""

import numpy as np
import pytest

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.fit_corpora import Corpora
from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import SentenceIndex, cosine_rows, evaluate_sts, load_and_index, spearman_x100
from promptemb.poolers import build_poolers
from promptemb.postprocessing import build_post, build_posts

TASKS = ["MINI12", "MINI-B", "MINI-SICK"]


@pytest.fixture(scope="module")
def encoder(tiny_bert):
    return Encoder(str(tiny_bert), batch_size=4, attentions=True, progress=False)


def setup(mini_data):
    root, registry_file = mini_data
    registry = load_registry(registry_file)
    return root, registry, get_tasks(TASKS, registry)


def test_post_on_target_task_equals_hand_computation(mini_data, encoder):
    root, registry, tasks = setup(mini_data)
    before = encoder.stats.forward_sequences
    result = evaluate_sts(encoder, tasks, root, build_poolers(["mean", "idf", "ditto"], {"ditto": {"head": 1}}),
                          ScoringOptions(posts=build_posts(["quantile_u", "whiten"]), corpora=Corpora(root, registry)))
    assert list(result["scores"]) == ["mean", "mean+quantile_u(T)", "mean+whiten(T)", "idf(T)",
                                      "idf(T)+quantile_u(T)", "idf(T)+whiten(T)", "ditto", "ditto+quantile_u(T)",
                                      "ditto+whiten(T)"]
    # one forward per unique sentence, although idf ran once per task and post-processors were fitted per task
    assert encoder.stats.forward_sequences - before == result["unique_sentences"]
    assert result["poolers"]["idf(T)"]["fit_corpus"] == "T"
    assert set(result["poolers"]["idf(T)"]["fit_corpus_sentences"]) == set(TASKS)
    assert result["post_processing"]["mean+quantile_u(T)"]["fit_corpus"] == "T"

    index = SentenceIndex()
    loaded = load_and_index(tasks, root, index)
    mean = encoder.embed(index.sentences, build_poolers(["mean"]))["mean"]
    for task in loaded:
        rows = sorted(set(task.left) | set(task.right))
        fitted = build_post("quantile_u").fit("T", mean[rows])
        left, right = fitted.transform(mean[task.left]), fitted.transform(mean[task.right])
        want = spearman_x100(cosine_rows(left, right), task.pairs.gold_array())
        assert result["scores"]["mean+quantile_u(T)"][task.spec.name] == pytest.approx(want, abs=1e-9)
        idf = build_poolers(["idf"])[0].fit("T", [index.sentences[i] for i in rows], encoder.tokenizer)
        emb = encoder.embed(index.sentences, [idf])["idf"]
        want = spearman_x100(cosine_rows(emb[task.left], emb[task.right]), task.pairs.gold_array())
        assert result["scores"]["idf(T)"][task.spec.name] == pytest.approx(want, abs=1e-4)


def test_reference_corpus_is_encoded_in_the_same_pass(mini_data, encoder, tmp_path):
    root, registry, tasks = setup(mini_data)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a cat sits on the mat .\nthe weather is nice today .\nstocks fell sharply on monday .\n")
    before = encoder.stats.forward_sequences
    label = f"file:{corpus}"
    options = ScoringOptions(posts=build_posts(["zscore"]), fit_corpus=label, corpora=Corpora(root, registry))
    result = evaluate_sts(encoder, tasks, root, build_poolers(["mean", "idf"]), options)
    assert f"mean+zscore({label})" in result["scores"] and f"idf({label})+zscore({label})" in result["scores"]
    # the corpus sentence also in MINI12 is encoded once: the index is shared
    assert encoder.stats.forward_sequences - before == result["unique_sentences"]
    assert result["fit_corpora"][label]["sha256"]
    assert result["post_processing"][f"mean+zscore({label})"]["fit_corpus_size"]["MINI-B"] == 3


def test_fit_corpus_errors(mini_data, encoder):
    root, registry, tasks = setup(mini_data)
    corpora = Corpora(root, registry)
    with pytest.raises(DataError, match=r"fit corpus 'W': file .*wiki1m_for_simcse.* does not exist"):
        evaluate_sts(encoder, tasks, root, build_poolers(["mean"]),
                     ScoringOptions(posts=build_posts(["zscore"]), fit_corpus="W", corpora=corpora))
    with pytest.raises(ConfigError, match="unknown fit corpus 'wiki'; valid: T, W, stsb_train, file:PATH"):
        evaluate_sts(encoder, tasks, root, build_poolers(["mean"]), ScoringOptions(fit_corpus="wiki", corpora=corpora))
    with pytest.raises(ConfigError, match="'stsb_train' needs task STSBenchmark-train"):
        evaluate_sts(encoder, tasks, root, build_poolers(["idf"], {"idf": {"corpus": "stsb_train"}}),
                     ScoringOptions(corpora=corpora))


def test_stsb_train_corpus_on_real_data(real_data_root):
    from promptemb.data.tasks import load_registry as real

    sentences = Corpora(real_data_root, real()).sentences("stsb_train")
    assert 10000 < len(sentences) <= 2 * 5749 and len(set(sentences)) == len(sentences)
    wiki = Corpora(real_data_root, real()).sentences("W")
    assert len(wiki) == 11914


def test_post_before_fit_in_variant_scoring_is_refused():
    with pytest.raises(ConfigError, match="transform before it was fitted"):
        build_post("whiten").transform(np.ones((3, 2)))
