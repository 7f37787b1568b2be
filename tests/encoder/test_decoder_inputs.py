"""Decoder inputs: padding side and batch composition do not change embeddings, only the sentence is ever cut
(a 1,000-token sentence keeps the template's last token), and bad input fails in one line before any forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.inputs import SENTENCE, SLOT, TEMPLATE
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.poolers import build_pooler
from promptemb.poolers.decoder import ECHO_DOCUMENT, PROMPTEOL
from tests.decoder_helpers import SENTENCES, load_causal_lm, save_tiny_decoder
from tests.decoder_references import echo_reference, last_token_reference
from tests.evaluation.test_evaluate_cli import evaluate
from tests.helpers import assert_close_scaled, assert_one_line_error

SMALL_HOOKS = {"token_prepending": {"layer": 2, "exit": 2}, "contrastive_prompting": {"layer": 2, "act_layer": 1}}
METHODS = ["prompteol", "pcot", "echo", "echo_mean", "token_prepending", "contrastive_prompting"]


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tiny_decoder(request, tmp_path_factory):
    """GPT-2 (learned absolute positions: the family where left padding moves positions) and LLaMA (RoPE)."""
    return save_tiny_decoder(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param, layers=3, hidden=32)


def test_padding_side_and_batch_composition_do_not_change_embeddings(tiny_decoder):
    poolers = [build_pooler(name, **SMALL_HOOKS.get(name, {})) for name in METHODS]
    runs = []
    for padding_side, batch_size in (("right", 1), ("left", 3), ("right", 8)):
        encoder = Encoder(str(tiny_decoder), device="cpu", batch_size=batch_size, progress=False,
                          padding_side=padding_side)
        runs.append(encoder.embed(SENTENCES, poolers))
    for name in METHODS:
        alone = runs[0][name]  # batch size 1: no padding at all
        assert alone.shape == (len(SENTENCES), 32)
        for other in runs[1:]:
            assert_close_scaled(other[name], alone, 1e-5, msg=name)  # float32 sums of other batch shapes


def test_left_padded_batch_has_positions_from_the_first_real_token(tiny_decoder):
    encoder = Encoder(str(tiny_decoder), device="cpu", progress=False, padding_side="left")
    builder = encoder.input_builder(build_pooler("prompteol").input_form())
    batch = builder.collate(builder.build(["ok", SENTENCES[5]]))
    short = batch.attention_mask[0]
    assert short[0] == 0 and short[-1] == 1  # padded on the left
    first = int(short.argmax())
    assert batch.position_ids[0, first:].tolist() == list(range(int(short.sum())))
    assert batch.position_ids[1].tolist() == list(range(batch.input_ids.shape[1]))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = save_tiny_decoder(tmp_path_factory.mktemp("tiny_llama"), "llama", layers=2, hidden=32)
    return directory, *load_causal_lm(directory)


LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 130)  # >= 1,000 tokens


def test_a_1000_token_sentence_keeps_the_template_suffix(llama):
    directory, tokenizer, model = llama
    assert len(tokenizer(LONG, add_special_tokens=False)["input_ids"]) >= 1000
    encoder = Encoder(str(directory), device="cpu", max_length=64, progress=False)
    pooler = build_pooler("prompteol")
    builder = encoder.input_builder(pooler.input_form())
    item = builder.build([LONG])[0]
    suffix = tokenizer('" means in one word:"', add_special_tokens=False)["input_ids"]
    assert item.truncated and len(item.input_ids) <= 64
    assert item.input_ids[-len(suffix):] == suffix and item.roles[-1] == TEMPLATE
    assert item.input_ids[0] == tokenizer.bos_token_id
    # the sentence rule's period comes after the cut and is a sentence token too
    assert item.sentence_length == item.roles.count(SENTENCE) <= builder.max_sentence_tokens + 1
    embedding = encoder.embed([LONG], [pooler])["prompteol"]
    assert encoder.truncation["templated"].truncated.tolist() == [True]
    # the official code on the sentence as cut gives the same embedding
    cut = tokenizer.decode([i for i, role in zip(item.input_ids, item.roles, strict=True) if role == SENTENCE])
    assert cut.startswith("the quick brown fox") and cut.endswith(".")
    expected = last_token_reference(model, tokenizer, [cut], [PROMPTEOL], -1).numpy()
    # the official code's float32 forward of the cut sentence: round-off of the embedding's largest entry
    assert_close_scaled(embedding, expected, 1e-5)


def test_echo_cuts_each_copy_and_keeps_the_closing_eos(llama):
    directory, tokenizer, model = llama
    encoder = Encoder(str(directory), device="cpu", max_length=64, progress=False)
    pooler = build_pooler("echo")
    builder = encoder.input_builder(pooler.input_form())
    item = builder.build([LONG])[0]
    assert item.truncated and len(item.input_ids) <= 64 and item.input_ids[-1] == tokenizer.eos_token_id
    embedding = encoder.embed([LONG], [pooler])["echo"]
    expected = echo_reference(model.base_model, tokenizer, [LONG], ECHO_DOCUMENT, "last",
                              max_length=builder.max_sentence_tokens).numpy()
    # the official code's float32 forward of the cut sentence: round-off of the embedding's largest entry
    assert_close_scaled(embedding, expected, 1e-5)


def test_token_prepending_slot_survives_truncation(llama):
    directory = llama[0]
    encoder = Encoder(str(directory), device="cpu", max_length=64, progress=False)
    item = encoder.input_builder(build_pooler("token_prepending").input_form()).build([LONG])[0]
    assert item.roles.count(SLOT) == 1 and len(item.input_ids) <= 64 and item.roles[-1] == TEMPLATE


def test_sentence_rule_of_the_official_code(llama):
    from promptemb.encoder.template import apply_sentence_rule

    assert apply_sentence_rule('He said "no"', "prompteol") == "He said 'no'"  # ends in a quote: no period
    assert apply_sentence_rule('He said "no', "prompteol") == "He said 'no."
    assert apply_sentence_rule("Why?", "prompteol") == "Why."
    assert apply_sentence_rule("Done.", "prompteol") == "Done."


# -- bad input: one line, before any forward -------------------------------------------------------------------------


def no_forward(encoder: Encoder):
    encoder.transformer.forward = lambda *args, **kwargs: pytest.fail("a forward ran before the error")
    return encoder


def test_decoder_method_on_an_encoder(tiny_bert):
    encoder = no_forward(Encoder(str(tiny_bert), device="cpu", progress=False))
    with pytest.raises(ConfigError, match=r"pooler 'prompteol' is a decoder prompt method .* is BertModel, an "
                                          r"encoder; use mask, mean"):
        encoder.embed(["a"], [build_pooler("prompteol")])


def test_mask_pooler_on_a_decoder(llama):
    encoder = no_forward(Encoder(str(llama[0]), device="cpu", progress=False))
    with pytest.raises(ConfigError, match=r"pooler 'mask' pools the template's \[MASK\] .* is LlamaModel, a decoder "
                                          r"\(causal LM\); use last_token, prompteol"):
        encoder.embed(["a"], [build_pooler("mask")], Template('This sentence : "[X]" means [MASK] .'))


@pytest.mark.parametrize(("template", "pattern"), [
    ('This sentence means "[X]', r"has no poolable last token \(it ends with the sentence\)"),
    ('This sentence means "[X]" <PST>', r"has no poolable last token \(it ends with <PST>\)"),
    ("Summarize: [X]", r"has no poolable last token \(it ends with the sentence\)"),
    (None, r"pooler 'last_token' pools the last token of a prompt; pass a template"),
])
def test_template_without_a_poolable_last_token(llama, template, pattern):
    encoder = no_forward(Encoder(str(llama[0]), device="cpu", progress=False))
    with pytest.raises(ConfigError, match=pattern):
        encoder.embed(["a"], [build_pooler("last_token")], None if template is None else Template(template))


@pytest.mark.parametrize(("name", "args", "pattern"), [
    ("prompteol@3", {}, r"layer 3 is out of range for a model with 2 layers; valid: 0 \(embeddings\) \.\. 2"),
    ("pcot@-4", {}, r"layer -4 is out of range"),
    ("token_prepending", {}, r"layer 27 is out of range"),  # the LLaMA-2-7B default on a 2-layer model
    ("token_prepending", {"layer": -1, "start": 2}, r"start block 2 is out of range for a model with 2 blocks"),
    ("contrastive_prompting", {"layer": -1}, r"act_layer 4 is out of range for a model with 2 blocks \(0\.\.1\)"),
])
def test_layer_index_out_of_range(llama, name, args, pattern):
    encoder = no_forward(Encoder(str(llama[0]), device="cpu", progress=False))
    with pytest.raises(ConfigError, match=pattern):
        encoder.embed(["a"], [build_pooler(name, **args)])


def test_qlora_without_cuda_is_refused_before_loading(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=r"quantization=4bit \(QLoRA\) needs a CUDA GPU and bitsandbytes"):
        Encoder(str(tmp_path / "not_even_read"), quantization="4bit")


def test_cli_decoder_method_on_an_encoder_is_one_line(tiny_bert, real_data_root, tmp_path):
    proc = evaluate(f"backbone.name_or_path={tiny_bert}", "poolers=[prompteol]", "tasks=[STS13]",
                    f"output_dir={tmp_path / 'out'}", data_root=real_data_root)
    assert_one_line_error(proc, r"pooler 'prompteol' is a decoder prompt method", tmp_path / "out")


def test_device_map_quantization_and_dtype_reach_from_pretrained(llama, monkeypatch):
    """Big-model options pass through to `from_pretrained` (accelerate places the weights; nothing is moved after)."""
    import promptemb.encoder.model as model_module

    seen = {}

    def fake_load(name_or_path, **kwargs):
        seen.update(kwargs)
        raise ConfigError("stop after recording the arguments")

    monkeypatch.setattr(model_module, "load_pretrained", fake_load)
    with pytest.raises(ConfigError, match="stop after recording"):
        Encoder(str(llama[0]), device_map="auto", dtype="bfloat16")
    assert seen["device_map"] == "auto" and seen["dtype"] == torch.bfloat16 and "quantization_config" not in seen


def test_bfloat16_decoder_embeddings_follow_float32(llama):
    sentences = SENTENCES[:3]
    pooler = build_pooler("prompteol")
    full = Encoder(str(llama[0]), device="cpu", progress=False).embed(sentences, [pooler])["prompteol"]
    half = Encoder(str(llama[0]), device="cpu", progress=False, dtype="bfloat16").embed(sentences, [pooler])
    half = half["prompteol"]
    assert half.dtype == np.float32 and half.shape == full.shape
    cosine = (half * full).sum(1) / np.linalg.norm(half, axis=1) / np.linalg.norm(full, axis=1)
    assert cosine.min() > 0.99
