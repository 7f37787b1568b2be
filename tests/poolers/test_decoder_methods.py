"""Decoder prompt methods against plain re-computations of their official code (tests/decoder_references.py), on
tiny random LLaMA- and OPT-family decoders: float32, error <= 1e-5 of the largest entry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler
from promptemb.poolers.decoder import (
    CONTRASTIVE_AUXILIARY,
    ECHO_DOCUMENT,
    KNOWLEDGE_ENHANCEMENT,
    METAEOL,
    PRETENDED_COT,
    PROMPTEOL,
    TOKEN_PREPENDING_PROMPTEOL,
)
from tests.decoder_helpers import SENTENCES, load_causal_lm, save_tiny_decoder
from tests.decoder_references import (
    contrastive_prompting_reference,
    echo_reference,
    last_token_reference,
    token_prepending_reference,
)
from tests.helpers import assert_close_scaled

SHORT = SENTENCES[:5]


@pytest.fixture(scope="module", params=["llama", "opt"])
def decoder(request, tmp_path_factory):
    """(family, directory, official tokenizer, official *ForCausalLM, framework Encoder)."""
    directory = save_tiny_decoder(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)
    tokenizer, model = load_causal_lm(directory)
    encoder = Encoder(str(directory), device="cpu", batch_size=2, progress=False)
    return request.param, directory, tokenizer, model, encoder


def assert_close(actual: np.ndarray, expected: torch.Tensor) -> None:
    """The official code's float32 forward against ours (other batch shapes, other kernels): to 1e-5 of the
    embeddings' largest entry (observed up to 4.2e-7 under AVX-512, AVX2 and one thread)."""
    assert_close_scaled(actual, expected.float(), 1e-5)


@pytest.mark.parametrize(("name", "templates", "layer"), [
    ("prompteol", [PROMPTEOL], -1),
    ("pcot", [PRETENDED_COT], -2),
    ("ke", [KNOWLEDGE_ENHANCEMENT], -2),
    ("prompteol@2", [PROMPTEOL], 2),
])
def test_last_token_methods_match_official(decoder, name, templates, layer):
    _, _, tokenizer, model, encoder = decoder
    pooler = build_pooler(name)
    assert pooler.layer == layer and pooler.template.text == templates[0]
    actual = encoder.embed(SHORT, [pooler])[name]
    assert_close(actual, last_token_reference(model, tokenizer, SHORT, templates, layer))


def test_metaeol_is_the_plain_mean_of_its_eight_prompts(decoder):
    _, _, tokenizer, model, encoder = decoder
    pooler = build_pooler("metaeol")
    assert len(pooler.parts()) == 8
    actual = encoder.embed(SHORT[:3], [pooler])["metaeol"]
    assert_close(actual, last_token_reference(model, tokenizer, SHORT[:3], list(METAEOL), -1))


@pytest.mark.parametrize("strategy", ["last", "mean"])
def test_echo_matches_official(decoder, strategy):
    family, _, tokenizer, model, encoder = decoder
    name = "echo" if strategy == "last" else "echo_mean"
    actual = encoder.embed(SHORT, [build_pooler(name)])[name]
    # the official template writes LLaMA's `<s>`; an OPT tokenizer's BOS is `</s>`
    template = ECHO_DOCUMENT if family == "llama" else ECHO_DOCUMENT.replace("<s>", "</s>")
    assert_close(actual, echo_reference(model.base_model, tokenizer, SHORT, template, strategy))


def test_token_prepending_matches_official(decoder):
    family, _, tokenizer, model, encoder = decoder
    if family != "llama":
        pytest.skip("the official Token Prepending code patches LLaMA, Qwen2 and Gemma2 modeling files only")
    for layer, start, exit in ((3, 1, 3), (-1, 0, 99)):
        pooler = build_pooler("token_prepending", layer=layer, start=start, exit=exit)
        actual = encoder.embed(SHORT, [pooler])["token_prepending"]
        expected = token_prepending_reference(model, tokenizer, SHORT, TOKEN_PREPENDING_PROMPTEOL, layer, start, exit,
                                              seed=3407)
        assert_close(actual, expected)


def test_contrastive_prompting_matches_official(decoder):
    family, _, tokenizer, model, encoder = decoder
    projection = "o_proj" if family == "llama" else "out_proj"  # OPT's name for the same module
    for layer, act_layer, coeff in ((3, 1, 0.5), (-1, 0, 0.25)):
        pooler = build_pooler("contrastive_prompting", layer=layer, act_layer=act_layer, coeff=coeff)
        actual = encoder.embed(SHORT, [pooler])["contrastive_prompting"]
        expected = contrastive_prompting_reference(model, tokenizer, SHORT, PROMPTEOL, CONTRASTIVE_AUXILIARY, layer,
                                                   act_layer, coeff, projection)
        assert_close(actual, expected)


def test_all_methods_in_one_call_equal_each_alone(decoder):
    """Poolers sharing an input form share its forward; every pooler gets what it gets alone."""
    _, _, _, _, encoder = decoder
    names = ["prompteol", "prompteol@2", "echo", "echo_mean", "token_prepending", "contrastive_prompting"]
    args = {"token_prepending": {"layer": 3, "exit": 3}, "contrastive_prompting": {"layer": 3, "act_layer": 1}}
    poolers = [build_pooler(name, **args.get(name, {})) for name in names]
    encoder.stats.forward_sequences = 0
    together = encoder.embed(SHORT, poolers)
    # prompteol and prompteol@2 share one forward: 4 forms (+1 auxiliary partial forward, not counted)
    assert encoder.stats.forward_sequences == 4 * len(SHORT)
    for pooler in poolers[1::2] + poolers[4:5]:  # one of each form
        alone = encoder.embed(SHORT, [build_pooler(pooler.name, **args.get(pooler.name, {}))])[pooler.name]
        np.testing.assert_array_equal(together[pooler.name], alone)


def test_last_token_of_the_run_template_equals_prompteol(decoder):
    """`last_token` pools the run's template (template=prompteol): the same input form as the `prompteol` pooler."""
    from promptemb.encoder.template import Template

    _, _, _, _, encoder = decoder
    own = encoder.embed(SHORT, [build_pooler("prompteol")])["prompteol"]
    run = encoder.embed(SHORT, [build_pooler("last_token")], Template(PROMPTEOL), "prompteol")["last_token"]
    np.testing.assert_array_equal(run, own)


@pytest.mark.parametrize(("name", "layer"), [("last_token_plain", -1), ("last_token_plain@2", 2)])
def test_last_token_of_the_plain_sentence(decoder, name, layer):
    """`last_token_plain`: no template; the last real token of the sentence tokenized alone with the tokenizer's own
    special tokens, each sentence on its own (no padding), at `layer`; it shares the plain forward with `mean`."""
    _, _, tokenizer, model, encoder = decoder
    pooler = build_pooler(name)
    encoder.stats.forward_sequences = 0
    together = encoder.embed(SHORT, [pooler, build_pooler("mean")])
    assert encoder.stats.forward_sequences == len(SHORT)  # one plain form for both poolers
    with torch.no_grad():
        expected = torch.stack([
            model(**tokenizer(sentence, return_tensors="pt"), output_hidden_states=True).hidden_states[layer][0, -1]
            for sentence in SHORT])
    assert_close(together[name], expected)
    assert encoder.stats.forms[-1]["poolers"] == [name, "mean"] and encoder.stats.forms[-1]["sentences"] == len(SHORT)
