"""Token Prepending with a given `<PST>` vector: a tiny LLaMA saved with an added `<PST>` row gives the official
method's output with that row (fuyuchenIfyw/token_prepending, re-computed in tests/decoder_references.py), a `.npy`
vector gives it with that vector, the seeded draw stays the default without a row, every source is recorded in the
provenance, and a missing / malformed / wrong-sized vector is refused in one line before any forward."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler
from promptemb.poolers.decoder import TOKEN_PREPENDING_PROMPTEOL
from tests.decoder_helpers import SENTENCES, load_causal_lm, save_tiny_decoder
from tests.decoder_references import token_prepending_reference
from tests.encoder.test_decoder_inputs import no_forward
from tests.evaluation.test_evaluate_cli import evaluate
from tests.helpers import assert_one_line_error
from tests.poolers.test_decoder_methods import assert_close

SHORT = SENTENCES[:5]
HOOK = {"layer": 3, "start": 1, "exit": 3}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(plain tiny LLaMA, the same model saved with an added `<PST>` token and row, that row)."""
    plain = save_tiny_decoder(tmp_path_factory.mktemp("tiny_llama"), "llama")
    tokenizer, model = load_causal_lm(plain)
    tokenizer.add_tokens(["<PST>"])
    model.resize_token_embeddings(len(tokenizer))
    row = 0.7 * torch.randn(64, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        model.get_input_embeddings().weight[tokenizer.convert_tokens_to_ids("<PST>")] = row
    with_row = tmp_path_factory.mktemp("tiny_llama_pst")
    model.save_pretrained(with_row)
    tokenizer.save_pretrained(with_row)
    return plain, with_row, row


def reference(directory, row=None, seed=None):
    tokenizer, model = load_causal_lm(directory)
    return token_prepending_reference(model, tokenizer, SHORT, TOKEN_PREPENDING_PROMPTEOL, HOOK["layer"],
                                      HOOK["start"], HOOK["exit"], seed=seed, row=row)


@pytest.mark.parametrize("placeholder", ["auto", "tokenizer"])
def test_the_models_own_pst_row_gives_the_official_output_with_that_row(models, placeholder):
    _, with_row, row = models
    encoder = Encoder(str(with_row), device="cpu", batch_size=2, progress=False)
    pooler = build_pooler("token_prepending", placeholder=placeholder, **HOOK)
    actual = encoder.embed(SHORT, [pooler])["token_prepending"]
    assert_close(actual, reference(with_row, row=row))
    record = pooler.describe()
    token_id = encoder.tokenizer.convert_tokens_to_ids("<PST>")
    assert record["placeholder"] == placeholder and record["placeholder_source"] == "tokenizer"
    assert record["placeholder_token_id"] == token_id
    assert record["placeholder_vector_sha256"] == hashlib.sha256(row.numpy().tobytes()).hexdigest()
    # the seeded draw is a different vector, and a different embedding
    drawn = encoder.embed(SHORT, [build_pooler("token_prepending", placeholder="random", **HOOK)])["token_prepending"]
    assert np.abs(drawn - actual).max() > 1e-3
    assert_close(drawn, reference(with_row, seed=3407))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_npy_vector_gives_the_official_output_with_that_vector(models, dtype, tmp_path):
    plain, _, row = models
    path = tmp_path / "pst.npy"
    np.save(path, row.numpy().astype(dtype))
    encoder = Encoder(str(plain), device="cpu", batch_size=2, progress=False)
    pooler = build_pooler("token_prepending", placeholder=str(path), **HOOK)
    actual = encoder.embed(SHORT, [pooler])["token_prepending"]
    assert_close(actual, reference(plain, row=row))
    record = pooler.describe()
    assert record["placeholder_source"] == "file" and record["placeholder_file"] == str(path)
    assert record["placeholder_file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_without_a_pst_token_auto_draws_the_seeded_vector(models):
    plain = models[0]
    encoder = Encoder(str(plain), device="cpu", batch_size=2, progress=False)
    pooler = build_pooler("token_prepending", seed=5, **HOOK)
    actual = encoder.embed(SHORT, [pooler])["token_prepending"]
    assert_close(actual, reference(plain, seed=5))
    record = pooler.describe()
    assert record["placeholder"] == "auto" and record["placeholder_source"] == "random"
    assert record["placeholder_seed"] == 5


# -- bad input: one line, before any forward -------------------------------------------------------------------------


def write(path, array):
    np.save(path, array)
    return str(path)


@pytest.mark.parametrize(("make", "pattern"), [
    (lambda d: str(d / "missing.npy"), r"placeholder file .*missing\.npy does not exist; write the <PST> vector"),
    (lambda d: write(d / "ints.npy", np.arange(64)), r"placeholder file .*ints\.npy holds int64 values; it must hold "
                                                     r"one float vector"),
    (lambda d: write(d / "row.npy", np.zeros((1, 64), np.float32)), r"has shape \(1, 64\); it must hold one vector "
                                                                    r"of the model's embedding size, shape \(D,\)"),
    (lambda d: write(d / "nan.npy", np.full(64, np.nan, np.float32)), r"nan\.npy has non-finite values"),
    (lambda d: (d / "text.npy").write_text("not numpy") and str(d / "text.npy"), r"text\.npy is not a \.npy array"),
    (lambda d: "pst.pt", r"placeholder must be auto, tokenizer, random or a path to a \.npy file, got 'pst\.pt'"),
])
def test_bad_placeholder_options_are_refused_when_built(make, pattern, tmp_path):
    with pytest.raises(ConfigError, match=pattern):
        build_pooler("token_prepending", placeholder=make(tmp_path))


def test_a_vector_of_the_wrong_size_is_refused_before_any_forward(models, tmp_path):
    encoder = no_forward(Encoder(str(models[0]), device="cpu", progress=False))
    pooler = build_pooler("token_prepending", placeholder=write(tmp_path / "v.npy", np.zeros(48, np.float32)), **HOOK)
    with pytest.raises(ConfigError, match=r"v\.npy holds a 48-dimensional vector; the model's input embeddings are "
                                          r"64-dimensional"):
        encoder.embed(SHORT, [pooler])


def test_a_pst_token_without_its_row_is_refused_before_any_forward(models, tmp_path):
    tokenizer, model = load_causal_lm(models[0])
    tokenizer.add_tokens(["<PST>"])  # the tokenizer saved with the token, the model without its row
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    encoder = no_forward(Encoder(str(tmp_path), device="cpu", progress=False))
    with pytest.raises(ConfigError, match=r"the tokenizer has <PST> \(id \d+\) but the model's input embeddings have "
                                          r"\d+ rows; save the model with its <PST> row"):
        encoder.embed(SHORT, [build_pooler("token_prepending", **HOOK)])


def test_placeholder_tokenizer_needs_the_token(models):
    encoder = no_forward(Encoder(str(models[0]), device="cpu", progress=False))
    with pytest.raises(ConfigError, match=r"placeholder=tokenizer, but the tokenizer has no <PST> token"):
        encoder.embed(SHORT, [build_pooler("token_prepending", placeholder="tokenizer", **HOOK)])


@pytest.mark.parametrize(("vector", "pattern"), [
    (None, r"^error: pooler 'token_prepending': placeholder file .*missing\.npy does not exist"),
    (np.zeros(48, np.float32), r"^error: pooler 'token_prepending': placeholder file .*pst\.npy holds a "
                               r"48-dimensional vector; the model's input embeddings are 64-dimensional"),
])
def test_cli_bad_placeholder_is_one_line(models, real_data_root, vector, pattern, tmp_path):
    path = tmp_path / "missing.npy" if vector is None else write(tmp_path / "pst.npy", vector)
    out = tmp_path / "out"
    proc = evaluate("backbone=decoder", f"backbone.name_or_path={models[0]}", "poolers=[token_prepending]",
                    "+pooler_args.token_prepending.layer=3", "+pooler_args.token_prepending.exit=3",
                    f"+pooler_args.token_prepending.placeholder={path}", "tasks=[STSBenchmark]", f"output_dir={out}",
                    data_root=real_data_root)
    assert_one_line_error(proc, pattern, out)
