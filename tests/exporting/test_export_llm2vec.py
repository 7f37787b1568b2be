"""LLM2Vec checkpoints by path: `load_encoder`, `export.py` (merged full weights, or a kept adapter) and evaluate.py
give the embeddings the recipe scores (its LLM2Vec pooling of the bidirectional model), on a tiny random LLaMA.

The reference is the framework's own code: the module's evaluation encoder and pooler (what the training callback
and evaluate.py score). `exporting/st_module.py` re-implements LLM2Vec's input format, bidirectional mask and
poolings standalone; these tests keep it in sync with encoder/decoder.py and poolers/llm2vec.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.exporting.runner import export_checkpoint
from promptemb.inference import load_encoder
from promptemb.inference.model_sources import open_trained_model
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from promptemb.lightning_modules.llm2vec import LLM2VecContrastive, LLM2VecMNTP
from promptemb.lightning_modules.recipe import RECORD_KEY
from tests.decoder_helpers import SENTENCES, save_tiny_decoder
from tests.exporting.test_export_decoder import sentence_transformer
from tests.helpers import assert_close_scaled

#: exported and framework embeddings are float32 forwards of the same weights batched and padded differently (merged
#: weights W + BA rounded once): equal to TOL of the embeddings' largest entry
TOL = 1e-5
LONG = "word " * 300  # cut to the sentence limit
CASES = [*SENTENCES, LONG, "x " * 5, "Is it?", "y", "  spaced  "]


def seeded_adapter(module: torch.nn.Module, seed: int) -> None:
    """LoRA B drawn at random (peft starts it at zero): a trained-looking adapter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))


def save_checkpoint(module, path: Path) -> Path:
    """As train.py writes it: the module's own on_save_checkpoint (adapter only, base name and sha256)."""
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 2}
    module.on_save_checkpoint(checkpoint)  # the adapter, its base's sha256 and the recipe's name
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """(base model dir, MNTP checkpoint, contrastive checkpoint on it, eos_token + instruction checkpoint,
    bos_token + instruction checkpoint)."""
    root = tmp_path_factory.mktemp("llm2vec_chain")
    base = save_tiny_decoder(root / "llama", "llama", layers=2, hidden=32)
    mntp = LLM2VecMNTP(str(base), lora_r=2, lora_alpha=4, lora_dropout=0.0, max_sentence_tokens=24)
    seeded_adapter(mntp, 1)
    mntp_ckpt = save_checkpoint(mntp, root / "mntp.ckpt")
    simcse = LLM2VecContrastive(str(base), mntp_adapter=str(mntp_ckpt), lora_r=2, lora_alpha=4,
                                max_sentence_tokens=24)
    seeded_adapter(simcse, 2)
    simcse_ckpt = save_checkpoint(simcse, root / "simcse.ckpt")
    eos = LLM2VecContrastive(str(base), views="triplets", pooling_mode="eos_token", lora_r=2, lora_alpha=4,
                             instruction="Retrieve a similar sentence:", padding_side="right")
    seeded_adapter(eos, 3)
    eos_ckpt = save_checkpoint(eos, root / "eos.ckpt")
    bos = LLM2VecContrastive(str(base), pooling_mode="bos_token", lora_r=2, lora_alpha=4,
                             instruction="Retrieve a similar sentence:")
    seeded_adapter(bos, 4)
    return base, mntp_ckpt, simcse_ckpt, eos_ckpt, save_checkpoint(bos, root / "bos.ckpt")


def scored(path: Path, sentences) -> np.ndarray:
    """What evaluate.py and the training callback score a checkpoint with: its evaluation encoder and own pooler."""
    module = load_module_checkpoint(path).module
    pooler = module.eval_poolers()[0]
    encoder = module.evaluation_encoder(batch_size=4)
    return encoder.embed(sentences, [pooler], module.eval_template, module.hparams.sentence_rule)[pooler.name]


@pytest.mark.parametrize("which", ["mntp", "simcse", "eos", "bos"])
def test_checkpoint_export_and_evaluate_give_the_recipe_embeddings(chain, which, tmp_path):
    _, mntp, simcse, eos, bos = chain
    ckpt = {"mntp": mntp, "simcse": simcse, "eos": eos, "bos": bos}[which]
    reference = scored(ckpt, CASES)
    assert np.abs(reference).max() > 0.1
    out = export_checkpoint(ckpt, tmp_path / "merged")  # adapter=merge is the default
    record = json.loads((out / "config.json").read_text())["promptemb"]
    assert record["pooler"]["name"] == "llm2vec" and record["template"] is None
    assert record["llm2vec"]["attention"] == "bidirectional" and record["adapter"] is None
    model = sentence_transformer(out)
    for batch_size in (1, 5):
        got = model.encode(CASES, batch_size=batch_size, convert_to_numpy=True)
        assert_close_scaled(got, reference, TOL, msg=f"sentence-transformers, batch {batch_size}")
    assert_close_scaled(load_encoder(out, device="cpu").encode(CASES), reference, TOL, msg="export")
    assert_close_scaled(load_encoder(ckpt, device="cpu").encode(CASES), reference, TOL, msg="checkpoint")
    for source in (ckpt, out):  # what evaluate.py opens: the model's own LLM2Vec pooler and input form
        trained = open_trained_model(str(source), device="cpu")
        assert trained.template is None and trained.encoder.is_decoder
        got = trained.encoder.embed(CASES, trained.poolers, trained.template, trained.sentence_rule,
                                    trained.max_sentence_tokens)[trained.poolers[0].name]
        assert_close_scaled(got, reference, TOL, msg=str(source))
    card = (out / "README.md").read_text()
    assert "LLM2Vec" in card and "bidirectional" in card
    if which == "eos":
        assert record["llm2vec"]["eos_suffix"] == " </s>" and record["decoder"]["padding_side"] == "right"
        assert record["llm2vec"]["instruction"] == "Retrieve a similar sentence:"
    if which == "bos":
        assert record["llm2vec"]["pooling_mode"] == "bos_token"


def test_bidirectional_attention_is_what_the_export_runs(chain, tmp_path):
    """The exported module's forward without the bidirectional mask (a plain causal forward) gives other
    embeddings: the export carries the attention change, not only the weights."""
    _, mntp, *_ = chain
    out = export_checkpoint(mntp, tmp_path / "merged")
    model = sentence_transformer(out)
    module = model[0]
    features = module.preprocess(CASES[:4])
    bidirectional = module.decoder_forward(dict(features))["sentence_embedding"]
    with torch.no_grad():
        causal = module.model(input_ids=features["input_ids"], attention_mask=features["attention_mask"],
                              position_ids=features["position_ids"], use_cache=False).last_hidden_state
    causal_mean = module.masked_mean(causal, features["pooled_span"])
    assert not torch.allclose(bidirectional.detach(), causal_mean, atol=1e-3)


def test_a_kept_adapter_exports_when_no_mntp_adapter_is_merged(chain, tmp_path):
    _, mntp, simcse, *_ = chain
    reference = scored(mntp, CASES)
    kept = export_checkpoint(mntp, tmp_path / "kept", adapter="keep")
    assert (kept / "adapter" / "adapter_model.safetensors").is_file() and not (kept / "model.safetensors").exists()
    assert_close_scaled(sentence_transformer(kept).encode(CASES, batch_size=3), reference, TOL)
    assert_close_scaled(load_encoder(kept, device="cpu").encode(CASES), reference, TOL)
    with pytest.raises(ConfigError) as caught:  # on top of a merged MNTP adapter: merge only, before any loading
        export_checkpoint(simcse, tmp_path / "refused", adapter="keep")
    assert "\n" not in str(caught.value) and "adapter=merge" in str(caught.value)
    assert not (tmp_path / "refused").exists()


def test_the_mntp_adapter_a_checkpoint_was_trained_on_must_be_the_recorded_one(chain, tmp_path):
    base, mntp, simcse, *_ = chain
    moved = tmp_path / "simcse.ckpt"
    checkpoint = torch.load(simcse, weights_only=True)
    other_mntp = tmp_path / "mntp.ckpt"
    module = LLM2VecMNTP(str(base), lora_r=2, lora_alpha=4, lora_dropout=0.0)
    seeded_adapter(module, 7)
    save_checkpoint(module, other_mntp)
    checkpoint[RECORD_KEY]["arguments"]["mntp_adapter"] = str(other_mntp)  # what the loader rebuilds from
    torch.save(checkpoint, moved)
    with pytest.raises(DataError) as caught:
        load_encoder(moved, device="cpu")
    assert "\n" not in str(caught.value) and "another MNTP adapter" in str(caught.value)
    other_mntp.unlink()
    with pytest.raises(DataError) as caught:
        load_encoder(moved, device="cpu")
    assert "\n" not in str(caught.value) and "no longer exists" in str(caught.value)
    shutil.copy(mntp, other_mntp)  # the very file, moved: accepted
    assert_close_scaled(load_encoder(moved, device="cpu").encode(CASES[:3]), scored(simcse, CASES[:3]), TOL)


def test_checkpoint_options_that_do_not_apply_are_one_line(chain, tmp_path):
    _, mntp, *_ = chain
    with pytest.raises(ConfigError) as caught:
        export_checkpoint(mntp, tmp_path / "out", pooler="last_token")
    assert "\n" not in str(caught.value) and "pooler=llm2vec" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_train_py_chain_then_evaluate_py_and_export_score_as_training_did(chain, real_data_root, tmp_path):
    """The path users walk: train.py's MNTP quickstart, its SimCSE quickstart on that adapter (exported by train.py's
    export hook), then evaluate.py on the run folder, its best checkpoint and the export: each gives the STS-B
    score the training run's final table holds for its own pooler."""
    from promptemb.inference.model_sources import best_checkpoint
    from promptemb.training.runner import train
    from tests.evaluation.test_evaluate_sources import evaluate_in_process
    from tests.training.test_train import checked, compose_train, tiny_overrides

    base = chain[0]
    mntp_run, simcse_run = tmp_path / "mntp", tmp_path / "simcse"
    steps = ["trainer.max_steps=2", "eval_every_n_steps=2"]
    train(checked(compose_train([*tiny_overrides("quickstart_llm2vec_mntp", base, real_data_root, mntp_run, None),
                                 *steps])))
    train(checked(compose_train([*tiny_overrides("quickstart_llm2vec_simcse", base, real_data_root, simcse_run,
                                                 None), *steps,
                                 f"model.mntp_adapter={mntp_run / 'checkpoints' / 'last.ckpt'}",
                                 f"export_dir={simcse_run / 'export'}", "model.train_pooling=evaluation"])))
    trained = json.loads((simcse_run / "results.json").read_text())
    expected = trained["scores"]["mask"]["STSBenchmark"]
    best = best_checkpoint(simcse_run)
    for source, name in ((simcse_run, "mask"), (best, "mask"), (simcse_run / "export", "llm2vec")):
        results = evaluate_in_process(source, real_data_root, tmp_path / f"eval_{source.name}")
        assert list(results["scores"]) == [name, "mean"]
        assert results["scores"][name]["STSBenchmark"] == pytest.approx(expected, abs=1e-9), source
    record = json.loads((simcse_run / "export" / "config.json").read_text())["promptemb"]
    assert record["source"]["module"].endswith("LLM2VecContrastive") and record["llm2vec"]["pooling_mode"] == "mean"
    # evaluate.py mode=encode on the export: its own pooler, the embeddings load_encoder gives
    (tmp_path / "in.txt").write_text("\n".join(CASES[:4]) + "\n")
    embeddings = evaluate_in_process(simcse_run / "export", real_data_root, tmp_path / "unused", "mode=encode",
                                     "pooler=llm2vec", f"input={tmp_path / 'in.txt'}",
                                     f"output={tmp_path / 'out.npy'}")
    assert_close_scaled(embeddings, load_encoder(simcse_run / "export", device="cpu").encode(CASES[:4]), TOL)
