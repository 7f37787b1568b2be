"""LLM2Vec's bidirectional decoders and poolers against the official package's embeddings (llm2vec 0.2.3 =
McGill-NLP/llm2vec@312adcf, tests/llm2vec_0.2.3.json made by tests/llm2vec_official_references.py in a side venv with
transformers 4.44.2): tiny random LLaMA, Mistral, Qwen2 and Gemma, float32, every pooling mode (bos_token included)
with and without an instruction, to <= 1e-4 of the official tensor's largest entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler, build_poolers
from tests.decoder_helpers import save_tiny_decoder
from tests.helpers import assert_close_scaled
from tests.llm2vec_official_references import load_tokenizer, seed_weights, tiny_config

REFERENCE = json.loads((Path(__file__).parents[1] / "llm2vec_0.2.3.json").read_text(encoding="utf-8"))
RTOL = 1e-4


def save_reference_model(directory: Path, family: str, attn_implementation: str = "eager") -> Path:
    """The reference's tiny model (same tokenizer, config and seeded weights as the side environment)."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(REFERENCE["tokenizer_json"])
    model = AutoModelForCausalLM.from_config(tiny_config(family, len(tokenizer), attn_implementation))
    seed_weights(model, REFERENCE["seed"])
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def reference_models(tmp_path_factory):
    cache: dict = {}

    def get(family: str, attn_implementation: str) -> Encoder:
        key = (family, attn_implementation)
        if key not in cache:
            directory = save_reference_model(tmp_path_factory.mktemp(f"l2v_{family}"), family, attn_implementation)
            # attentions=true loads the model with eager attention, else transformers' default (sdpa)
            cache[key] = Encoder(str(directory), device="cpu", batch_size=3, progress=False,
                                 attentions=attn_implementation == "eager")
            assert cache[key].transformer.config._attn_implementation == attn_implementation
        return cache[key]

    return get


def case_id(case: dict) -> str:
    return (f"{case['family']}-{case['pooling_mode']}-{'instruction' if case['instruction'] else 'plain'}"
            f"{'' if case['bidirectional'] else '-causal'}")


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=case_id)
def test_embeddings_match_official(reference_models, case):
    encoder = reference_models(case["family"], case["attn_implementation"])
    # llm2vec 0.2.3's Qwen2BiModel is causal under eager and sdpa attention (REFERENCE["qwen2_note"])
    official_bidirectional = case["bidirectional"] and case["family"] != "qwen2"
    pooler = build_pooler("llm2vec", pooling_mode=case["pooling_mode"], instruction=case["instruction"],
                          bidirectional=official_bidirectional)
    actual = encoder.embed(REFERENCE["sentences"], [pooler])["llm2vec"]
    expected = torch.tensor(case["embeddings"])
    assert actual.shape == tuple(expected.shape)
    assert_close_scaled(actual, expected, RTOL, msg=case_id(case))


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_bidirectional_is_not_causal_and_sdpa_equals_eager(reference_models, family):
    """The mean of the bidirectional model differs from the causal one; sdpa and eager give the same embeddings."""
    sentences = REFERENCE["sentences"]
    eager, sdpa = reference_models(family, "eager"), reference_models(family, "sdpa")
    poolers = build_poolers(["llm2vec_mean", "llm2vec_last_token"])
    causal = build_pooler("llm2vec", bidirectional=False)
    a = eager.embed(sentences, [*poolers, causal])
    b = sdpa.embed(sentences, [*poolers, causal])
    for name in ("llm2vec_mean", "llm2vec_last_token", "llm2vec"):
        assert_close_scaled(b[name], torch.as_tensor(a[name]), 1e-5, msg=name)
    assert abs(a["llm2vec_mean"] - a["llm2vec"]).max() > 1e-2


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma"])
def test_first_token_sees_the_last(reference_models, family):
    """Bidirectional: the first token's state changes when only the last word of the sentence changes (Qwen2 too,
    whose official variant is causal on the CPU)."""
    encoder = reference_models(family, "eager")
    pooler = build_pooler("llm2vec_mean")
    out = {}
    for sentence in ("the sun is shining", "the sun is night"):
        form = pooler.input_form()
        builder = encoder.input_builder(form)
        batch = builder.collate(builder.build([sentence]))
        out[sentence] = encoder.forward(batch, pooler.needs, builder).layer(-1)[0, 1]
    assert (out["the sun is shining"] - out["the sun is night"]).abs().max() > 1e-3


def test_instruction_is_not_pooled_and_eos_text(reference_models):
    """The pooled span is the sentence's tokens (no <s>, no instruction); eos_token appends ' </s>' (LLaMA)."""
    encoder = reference_models("llama", "eager")
    tokenizer = encoder.tokenizer
    pooler = build_pooler("llm2vec_eos_token", instruction="Retrieve semantically similar text:")
    encoder.check_poolers([pooler], None)
    builder = encoder.input_builder(pooler.input_form())
    item = builder.build(["the sun is shining "])[0]
    pooled = [i for i, role in zip(item.input_ids, item.roles) if role == 3]
    alone = tokenizer("the sun is shining </s>", add_special_tokens=False)["input_ids"]
    # the official embed_mask: as many tokens as the sentence part has alone, counted from the end
    assert len(pooled) == len(alone) and pooled == item.input_ids[-len(alone):]
    assert item.input_ids[: -len(alone)] == tokenizer("Retrieve semantically similar text:")["input_ids"]
    assert item.input_ids[0] == tokenizer.bos_token_id and item.input_ids[-1] == tokenizer.eos_token_id
    assert pooler.describe()["eos_suffix"] == " </s>"


@pytest.mark.parametrize(("name", "args", "pattern"), [
    ("llm2vec", {"pooling_mode": "cls"}, r"^pooler 'llm2vec': LLM2Vec has no pooling mode 'cls'; "
                                         r"valid: mean, weighted_mean, eos_token, last_token, bos_token$"),
    ("llm2vec_mean", {"eos": "mine"}, r"unknown eos 'mine'; valid: official, tokenizer"),
])
def test_bad_arguments_are_one_line(name, args, pattern):
    with pytest.raises(ConfigError, match=pattern) as caught:
        build_pooler(name, **args)
    assert "\n" not in str(caught.value)


def test_bos_token_pools_the_bos_and_needs_a_tokenizer_that_writes_one(reference_models):
    """bos_token is the state at `<s>`, the first real position of each row on either padding side; a tokenizer
    that writes no BOS in front of a text (GPT-2's) is refused in one line."""
    from types import SimpleNamespace

    from promptemb.encoder.decoder import DecoderInputBuilder
    from tests.decoder_helpers import train_tokenizer

    encoder = reference_models("llama", "eager")
    pooler, mean = build_pooler("llm2vec_bos_token"), build_pooler("llm2vec_mean")
    encoder.check_poolers([pooler, mean], None)
    assert pooler.bos_id == encoder.tokenizer.bos_token_id == 1
    for side in ("left", "right"):
        builder = DecoderInputBuilder(encoder.tokenizer, pooler.input_form(), 512, side)
        batch = builder.collate(builder.build(REFERENCE["sentences"][:3]))
        out = encoder.forward(batch, pooler.needs, builder)
        first = batch.attention_mask.argmax(1)  # the first real token, <s>
        assert (batch.input_ids[torch.arange(3), first] == 1).all()
        assert torch.equal(pooler(out), out.layer(-1)[torch.arange(3), first])
    with pytest.raises(ConfigError, match=r"^pooler 'llm2vec_bos_token': pooling_mode bos_token pools the BOS "
                                          r"token, but the tokenizer writes none in front of a text; use another "
                                          r"pooling mode$"):
        pooler.bind_encoder(SimpleNamespace(tokenizer=train_tokenizer("gpt2"), transformer=None))


def test_unknown_pooling_mode_from_the_command_line(mini_data, tmp_path):
    """`evaluate.py +pooler_args.llm2vec.pooling_mode=cls`: one line, exit 2, before any weight loads (the model
    directory has none) and nothing written."""
    from tests.evaluation.test_evaluate_cli import evaluate
    from tests.helpers import assert_one_line_error

    root, registry = mini_data
    model = save_reference_model(tmp_path / "config_only", "llama")
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    out = tmp_path / "out"
    proc = evaluate("backbone=decoder", f"backbone.name_or_path={model}", "poolers=[llm2vec]",
                    "+pooler_args.llm2vec.pooling_mode=cls", "tasks=[MINI-B]", f"task_registry={registry}",
                    f"output_dir={out}", data_root=root)
    assert_one_line_error(proc, r"^error: pooler 'llm2vec': LLM2Vec has no pooling mode 'cls'; valid: mean, "
                                r"weighted_mean, eos_token, last_token, bos_token$", out)


def test_unsupported_family_is_refused_before_its_weights_load(tmp_path, monkeypatch):
    """evaluate.py reads the config first: a GPT-2 decoder (no bidirectional variant) is refused in one line before
    any weight loads; the causal variant needs no check."""
    import promptemb.encoder.model as model_module
    from promptemb.encoder.model import check_poolers_on_config

    directory = save_tiny_decoder(tmp_path / "gpt2", "gpt2", layers=2)
    monkeypatch.setattr(model_module, "load_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match=r"^pooler 'llm2vec_mean' needs bidirectional attention, which runs on "
                                          r"llama, mistral, qwen2, gemma decoders .* but the model is 'gpt2'$"):
        check_poolers_on_config(str(directory), build_poolers(["prompteol", "llm2vec_mean"]))
    check_poolers_on_config(str(directory), [build_pooler("llm2vec", bidirectional=False)])


def test_evaluate_scores_llm2vec_poolers(mini_data, tmp_path):
    """`evaluate.py backbone=decoder poolers=[llm2vec_mean,...]`: the three modes of one input share one forward;
    bidirectional attention is recorded in the provenance."""
    from tests.evaluation.test_evaluate_cli import evaluate

    root, registry = mini_data
    model = save_tiny_decoder(tmp_path / "tiny_llama", "llama", layers=2, hidden=32)
    out = tmp_path / "out"
    names = ["llm2vec_mean", "llm2vec_weighted_mean", "llm2vec_last_token", "llm2vec_eos_token"]
    proc = evaluate("backbone=decoder", f"backbone.name_or_path={model}", "backbone.device=cpu",
                    f"poolers=[{','.join(names)}]", "tasks=[MINI-B]", f"task_registry={registry}",
                    f"output_dir={out}", data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert list(results["scores"]) == names
    prov = results["provenance"]
    assert prov["poolers"]["llm2vec_mean"].items() >= {"pooling_mode": "mean", "attention": "bidirectional",
                                                        "instruction": "", "skip_instruction": True}.items()
    assert len(prov["forward_forms"]) == 2  # mean/weighted_mean/last_token share one; eos_token has its end text
