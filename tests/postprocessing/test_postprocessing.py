"""Post-processors against scikit-learn / plain numpy loops; fit-before-transform; labels carry the corpus."""

import numpy as np
import pytest
from sklearn.preprocessing import QuantileTransformer

from promptemb.common.errors import ConfigError
from promptemb.postprocessing import POST_NAMES, build_post, build_posts


@pytest.fixture()
def data():
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(6, 6))
    fit = rng.normal(size=(50, 6)) @ mixing + 3.0
    other = rng.normal(size=(9, 6)) @ mixing + 3.0
    return fit, other


def test_quantile_u_equals_sklearn(data):
    fit, other = data
    got = build_post("quantile_u").fit("T", fit).transform(other)
    want = QuantileTransformer(n_quantiles=50, output_distribution="uniform", subsample=None).fit(fit).transform(other)
    np.testing.assert_array_equal(got, want)
    # and it is the per-dimension empirical CDF, linearly interpolated, on the fit points themselves
    on_fit = build_post("quantile_u").fit("T", fit).transform(fit)
    for d in range(fit.shape[1]):
        ranks = np.argsort(np.argsort(fit[:, d]))
        np.testing.assert_allclose(on_fit[:, d], ranks / (len(fit) - 1), atol=1e-9)


def test_zscore_loop(data):
    fit, other = data
    got = build_post("zscore").fit("W", fit).transform(other)
    for d in range(fit.shape[1]):
        column = [row[d] for row in fit]
        mean = sum(column) / len(column)
        std = (sum((v - mean) ** 2 for v in column) / len(column)) ** 0.5
        np.testing.assert_allclose(got[:, d], (other[:, d] - mean) / std, rtol=1e-10)


def loop_covariance(rows):
    mean = np.zeros(rows.shape[1])
    for row in rows:
        mean += row / len(rows)
    cov = np.zeros((rows.shape[1], rows.shape[1]))
    for row in rows:
        cov += np.outer(row - mean, row - mean) / len(rows)
    return mean, cov


@pytest.mark.parametrize("k", [None, 3])
def test_whiten_loop(data, k):
    fit, other = data
    got = build_post("whiten", k=k).fit("T", fit).transform(other)
    mean, cov = loop_covariance(fit)
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(-values)[: k or len(values)]
    for i, row in enumerate(other):
        want = [(row - mean) @ vectors[:, j] / np.sqrt(values[j]) for j in order]
        # eigenvectors are defined up to sign
        np.testing.assert_allclose(np.abs(got[i]), np.abs(want), rtol=1e-6, atol=1e-8)
    whitened_fit = build_post("whiten").fit("T", fit).transform(fit)
    np.testing.assert_allclose(np.cov(whitened_fit.T, bias=True), np.eye(6), atol=1e-8)


def test_abtt_loop(data):
    fit, other = data
    got = build_post("abtt", k=2).fit("T", fit).transform(other)
    mean, cov = loop_covariance(fit)
    values, vectors = np.linalg.eigh(cov)
    top = [vectors[:, j] for j in np.argsort(-values)[:2]]
    for i, row in enumerate(other):
        want = row - mean
        for u in top:
            want = want - (u @ (row - mean)) * u
        np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-8)
    assert build_post("abtt").fit("T", np.random.default_rng(1).normal(size=(20, 384))).k_used == 3


def test_normalize_needs_no_fit(data):
    _, other = data
    got = build_post("normalize").transform(other)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0)
    assert build_post("normalize").label == "normalize"


@pytest.mark.parametrize("name", [n for n in POST_NAMES if n != "normalize"])
def test_transform_before_fit_is_a_config_error(name, data):
    with pytest.raises(ConfigError, match=f"post-processor '{name}' was asked to transform before it was fitted"):
        build_post(name).transform(data[1])
    fitted = build_post(name).fit("stsb_train", data[0])
    assert fitted.label == f"{name}(stsb_train)" and fitted.describe()["fit_corpus"] == "stsb_train"


def test_registry_errors():
    with pytest.raises(ConfigError, match="unknown post-processor 'pca'; valid: quantile_u, zscore"):
        build_posts(["pca"])
    with pytest.raises(ConfigError, match="post_args given for whiten"):
        build_posts(["zscore"], {"whiten": {"k": 2}})
    with pytest.raises(ConfigError, match="needs at least 2 embeddings"):
        build_post("zscore").fit("T", np.zeros((1, 3)))
