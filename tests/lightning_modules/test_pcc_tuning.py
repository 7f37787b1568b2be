"""Pcc-tuning's second stage (lightning_modules/pcc_tuning.py, lightning_modules/pearson.py): equal to the official
ZBWpro/Pcc-tuning code/tune.py on a tiny random LLaMA (reference arrays of tests/pcc_tuning_71768f8.json, made by
tests/pcc_tuning_official_references.py), gradient caching, adapter-only checkpoints rebuilt on the base alone, the
stage-one adapter's checks, and bad data refused in one line before any weights load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.scored_pairs import ScoredPairDataModule
from promptemb.inference.prompt_encoder import PromptEncoder
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from promptemb.lightning_modules.pcc_tuning import PccTuning
from promptemb.lightning_modules.pearson import pearson_loss
from promptemb.lightning_modules.prompteol import ADAPTER_RECORD, PromptEOLSup, is_adapter_key
from promptemb.lightning_modules.recipe import RECORD_KEY
from tests.conftest import REPO
from tests.helpers import assert_close_scaled, assert_one_line_error, assert_tensors_close
from tests.pcc_tuning_official_references import load_tokenizer, lora_key, seed_lora, seed_weights, tiny_config
from tests.training.test_train import checked, compose_train

REFERENCE = json.loads((Path(__file__).parents[1] / "pcc_tuning_71768f8.json").read_text(encoding="utf-8"))
PAIRS = [(first, second) for first, second, _ in REFERENCE["pairs"]]
SCORES = [score for _, _, score in REFERENCE["pairs"]]
LORA = REFERENCE["lora"]


def template_of(official: str) -> str:
    return official.replace("*sent_0*", "[X]")


def batch(pairs=PAIRS, scores=SCORES) -> dict:
    return {"pairs": list(pairs), "scores": torch.tensor(scores, dtype=torch.float32)}


@pytest.fixture(scope="module")
def reference_model(tmp_path_factory) -> Path:
    """The official run's tiny LLaMA and tokenizer, rebuilt from the reference file."""
    from transformers import LlamaForCausalLM

    directory = tmp_path_factory.mktemp("pcc_llama")
    tokenizer = load_tokenizer(REFERENCE["tokenizer_json"])
    model = LlamaForCausalLM(tiny_config(len(tokenizer)))
    seed_weights(model, REFERENCE["seed"])
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_stage_one(model_dir: Path, path: Path, **settings) -> Path:
    """A PromptEOLSup checkpoint as train.py writes it, holding the reference's stage-one adapter."""
    module = PromptEOLSup(str(model_dir), lora_r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                          lora_target_modules=LORA["target_modules"], **settings)
    seed_lora(module.transformer, REFERENCE["seed"] + 1)
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 7}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def stage_one(reference_model, tmp_path_factory) -> Path:
    return write_stage_one(reference_model, tmp_path_factory.mktemp("stage_one") / "last.ckpt")


def lora_grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {lora_key(name): p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: f"{c['template'][-12:]}-cut{c['cutoff_len']}")
def test_loss_and_lora_gradients_equal_the_official_tune_py(case, reference_model, stage_one):
    module = PccTuning(str(reference_model), stage_one_adapter=str(stage_one),
                       templates=[template_of(case["template"])], max_sentence_tokens=case["cutoff_len"])
    module.train()
    builder = module.builders[0]
    prompts = [item.input_ids for item in builder.build([a for a, _ in PAIRS] + [b for _, b in PAIRS])]
    assert prompts == case["input_ids"]  # the same tokens: the cut, no sentence rule, the filled template
    with torch.no_grad():
        firsts, seconds, _ = module.contrastive_views(batch())
    # float32 forwards of the same weights (other attention kernels, positions not shifted by the padding)
    assert_close_scaled(firsts, torch.tensor(case["anchors"]), 1e-5, msg="anchors")
    assert_close_scaled(seconds, torch.tensor(case["pairs"]), 1e-5, msg="pairs")
    loss, rows, to_backward = module.contrastive_loss(batch())
    to_backward(loss).backward()
    assert rows == len(PAIRS)
    assert abs(loss.item() - case["loss"]) <= 1e-5, (loss.item(), case["loss"])
    expected = {name: torch.tensor(grad) for name, grad in case["lora_grads"].items()}
    assert_tensors_close(lora_grads(module), expected, 1e-4)


def test_pearson_loss_equals_the_official_and_exact_is_pearsons_r():
    for case in REFERENCE["pearson"]:
        x = torch.tensor(case["x"], requires_grad=True)
        y = torch.tensor(case["y"])
        loss = pearson_loss(x, y)
        loss.backward()
        assert_close_scaled(loss.detach(), torch.tensor(case["loss"]), 1e-6, atol=1e-6)
        assert_close_scaled(x.grad, torch.tensor(case["grad"]), 1e-5, atol=1e-7)
        n = len(case["x"])
        r = np.corrcoef(np.array(case["x"], dtype=np.float64), np.array(case["y"], dtype=np.float64))[0, 1]
        exact = pearson_loss(x.detach(), y, "exact")
        assert abs(exact.item() - (1 - r)) <= 1e-6
        assert abs((1 - loss.item()) - r * (n - 1) / n) <= 1e-6  # the official ρ is r scaled by (n − 1)/n
    scores = torch.tensor([1.0, 2.0, 4.0])
    assert pearson_loss(torch.tensor([0.1, 0.2, 0.3]), 2 * scores + 1).item() == pytest.approx(
        pearson_loss(torch.tensor([0.1, 0.2, 0.3]), scores).item(), abs=1e-6)  # affine in the scores
    assert torch.isnan(pearson_loss(torch.tensor([0.1, 0.2, 0.3]), torch.full((3,), 3.0)))  # undefined: NaN


def test_gradient_caching_gives_the_full_batch_gradient(reference_model, stage_one):
    def gradients(chunk):
        torch.manual_seed(0)
        module = PccTuning(str(reference_model), stage_one_adapter=str(stage_one), grad_cache_chunk_size=chunk,
                           pearson="exact")
        module.train()
        loss, _, to_backward = module.contrastive_loss(batch())
        to_backward(loss).backward()
        return loss.item(), lora_grads(module)

    plain_loss, plain = gradients(None)
    cached_loss, cached = gradients(3)
    assert abs(cached_loss - plain_loss) <= 1e-6
    assert_tensors_close(cached, plain, 1e-5)


def test_stage_one_settings_and_a_fresh_adapter(reference_model, stage_one, tmp_path):
    module = PccTuning(str(reference_model), stage_one_adapter=str(stage_one))
    assert (module.hparams.lora_r, module.hparams.lora_alpha, module.hparams.lora_target_modules) == (
        LORA["r"], LORA["alpha"], LORA["target_modules"])
    assert module.hparams.sentence_rule == "prompteol" and module.builders[0].form.sentence_rule == "none"
    recorded = torch.load(stage_one, weights_only=True)["state_dict"]
    assert all(torch.equal(module.state_dict()[key], value) for key, value in recorded.items())
    fresh = PccTuning(str(reference_model), lora_r=2)
    assert fresh.hparams.lora_r == 2 and fresh.hparams.lora_alpha == 16 and fresh.stage_one is None


@pytest.mark.parametrize(("settings", "message"), [
    ({"lora_r": 8}, "model.lora_r=8 but the stage-one adapter has lora_r=4; Pcc-tuning trains that adapter further"),
    ({"dtype": "bfloat16"}, "model.dtype=bfloat16 but stage one loaded its base with dtype=float32"),
    ({"pearson": "spearman"}, "model.pearson='spearman'; valid: pcc_tuning, exact"),
])
def test_settings_that_contradict_stage_one_are_refused_before_loading(settings, message, stage_one, tmp_path):
    with pytest.raises(ConfigError) as caught:  # the model path does not exist: nothing was loaded
        PccTuning(str(tmp_path / "never-read"), stage_one_adapter=str(stage_one), **settings)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_stage_one_of_another_recipe_or_base_is_refused(reference_model, stage_one, tmp_path):
    checkpoint = torch.load(stage_one, weights_only=True)
    checkpoint[RECORD_KEY] = {**checkpoint[RECORD_KEY], "name": "llm2vec_contrastive",
                              "class": "promptemb.lightning_modules.llm2vec.LLM2VecContrastive"}
    torch.save(checkpoint, tmp_path / "l2v.ckpt")
    with pytest.raises(DataError, match="is a checkpoint of LLM2VecContrastive; Pcc-tuning continues a PromptEOL"):
        PccTuning(str(tmp_path / "never-read"), stage_one_adapter=str(tmp_path / "l2v.ckpt"))
    with pytest.raises(ConfigError, match="does not exist"):
        PccTuning(str(tmp_path / "never-read"), stage_one_adapter=str(tmp_path / "missing.ckpt"))
    other = tmp_path / "other"  # same shapes and tokenizer, other weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(reference_model)
    seed_weights(model, 7)
    model.save_pretrained(other)
    AutoTokenizer.from_pretrained(reference_model).save_pretrained(other)
    with pytest.raises(DataError) as caught:
        PccTuning(str(other), stage_one_adapter=str(stage_one))
    assert "was trained on base weights sha256" in str(caught.value) and "\n" not in str(caught.value)


def test_batches_without_scores_are_refused(reference_model):
    module = PccTuning(str(reference_model))
    with pytest.raises(ConfigError, match="trains on sentence pairs with gold similarity scores"):
        module.contrastive_loss([("a", "b", "c")])


@pytest.fixture(scope="module")
def trained(reference_model, stage_one, tmp_path_factory):
    """Three Lightning steps on STS-B + SICK-R train pairs (data=sts_sick_pairs's files), then a checkpoint."""
    root = os.environ.get("PROMPTEMB_DATA")
    if not root or not Path(root, "downstream/SICK/SICK_train.txt").is_file():
        pytest.skip("needs the local STS-B and SICK data ($PROMPTEMB_DATA)")
    pl.seed_everything(0)
    module = PccTuning(str(reference_model), stage_one_adapter=str(stage_one))
    data = ScoredPairDataModule(["downstream/STS/STSBenchmark/sts-train.csv", "downstream/SICK/SICK_train.txt"],
                                format=["stsb", "sick_relatedness"], batch_size=8, data_root=root,
                                held_out_tasks=["STSBenchmark", "STSBenchmark-dev"], max_examples=64,
                                cache_dir=str(tmp_path_factory.mktemp("cache")))
    trainer = pl.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    path = tmp_path_factory.mktemp("ckpt") / "pcc.ckpt"
    trainer.save_checkpoint(path)
    return module.eval(), path, data


def test_merged_corpus_reads_both_files_with_their_scales(trained):
    from promptemb.data.training_corpora import scored_pairs

    _, _, data = trained
    assert len(data.corpus) == 64 and data.corpus.scores().max() <= 5.0
    full = ScoredPairDataModule(data.file, format=data.format, batch_size=8, data_root=data.data_root,
                                held_out_tasks=["STSBenchmark", "STSBenchmark-dev"], cache_dir=str(data.cache_dir))
    full.setup("fit")
    root = Path(data.data_root)
    stsb = scored_pairs(root / data.file[0], "stsb")
    sick = scored_pairs(root / data.file[1], "sick_relatedness")
    assert len(full.corpus) + full.dropped_held_out == len(stsb) + len(sick) == 5749 + 4500
    assert full.dropped_held_out == 674  # STS-B train pairs sharing a sentence with STS-B dev or test
    table, scores = full.corpus.table, full.corpus.scores()
    # STS-B's rows first (0-5), then SICK's in its own layout and scale (1-5), its last pair last
    assert (table[0]["text0"], scores[0]) == (stsb[0][0], stsb[0][2])
    assert (table[-1]["text0"], table[-1]["text1"], scores[-1]) == sick[-1]
    assert scores[len(full.corpus) - len(sick):].min() >= 1.0


def test_checkpoint_is_the_whole_adapter_rebuilt_on_the_base_alone(trained, stage_one, reference_model):
    module, path, _ = trained
    checkpoint = torch.load(path, weights_only=True)
    assert all(is_adapter_key(key) for key in checkpoint["state_dict"])
    record = checkpoint[RECORD_KEY]
    assert (record["name"], record["class"]) == ("pcc_tuning", "promptemb.lightning_modules.pcc_tuning.PccTuning")
    assert record["arguments"]["stage_one_adapter"] is None
    assert checkpoint["hyper_parameters"]["stage_one_adapter"] is None
    assert record["arguments"]["lora_r"] == LORA["r"]  # stage one's settings, resolved: the rebuild never reads it
    assert checkpoint[ADAPTER_RECORD]["stage_one_adapter"]["path"] == str(stage_one.resolve())
    assert module.hparams.stage_one_adapter == str(stage_one.resolve())  # the live module keeps its own record
    stage_one.rename(stage_one.with_suffix(".moved"))  # the rebuild never reads stage one
    try:
        loaded = load_module_checkpoint(path)
    finally:
        stage_one.with_suffix(".moved").rename(stage_one)
    reloaded = loaded.module
    assert loaded.recipe == "pcc_tuning" and isinstance(reloaded, PccTuning) and type(reloaded).adapter_only
    sentences = [a for a, _ in PAIRS]
    torch.testing.assert_close(reloaded.embed(sentences), module.embed(sentences), rtol=0, atol=0)
    spec = reloaded.encoding_spec()  # what load_encoder and an export use: the evaluation's prompts, not training's
    assert (spec.pooler, spec.sentence_rule, spec.adapter["base_weights_sha256"]) == (
        "last_token", "prompteol", reloaded.base_weights_sha256)
    encoded = PromptEncoder.from_checkpoint(path).encode(sentences, show_progress_bar=False)
    assert_close_scaled(torch.as_tensor(encoded), module.embed(sentences), 1e-5)  # two batchings of one forward
    before = PccTuning(str(reference_model), stage_one_adapter=str(stage_one)).embed(sentences)
    assert not torch.allclose(before, module.embed(sentences))  # three steps moved the adapter


def stsb_file(path: Path, scores: list[float]) -> Path:
    rows = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{score:.3f}\tA man number {i} plays.\tA person {i} plays music."
            for i, score in enumerate(scores)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("overrides", "pattern"), [
    (["data=sick_triplets"], r"^error: Pcc-tuning trains on sentence pairs with gold similarity scores \(data="
                             r"sts_sick_pairs, data=stsb_pairs or data=sickr_pairs\); the data config gives "
                             r"data\.format=sick, examples without a score column$"),
    (["data=stsb_pairs", "data.file=CONSTANT"], r"^error: every training pair scores 3 \(data\.file=.*\): Pearson's "
                                                r"correlation is undefined for constant gold scores"),
])
def test_train_refuses_data_without_graded_scores_in_one_line(overrides, pattern, reference_model, stage_one,
                                                              real_data_root, tmp_path):
    constant = stsb_file(tmp_path / "constant.csv", [3.0] * 40)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PROMPTEMB_DATA": str(real_data_root)}
    overrides = [o.replace("CONSTANT", str(constant)) for o in overrides]
    run = subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=quickstart_pcc_tuning_smollm2",
                          f"backbone.name_or_path={reference_model}", *overrides,
                          f"model.stage_one_adapter={stage_one}", f"output_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert_one_line_error(run, pattern, tmp_path / "run")


REFUSED_DATA = [
    (["data=sick_triplets"], ConfigError, "Pcc-tuning trains on sentence pairs with gold similarity scores (data="
                                          "sts_sick_pairs, data=stsb_pairs or data=sickr_pairs); the data config gives "
                                          "data.format=sick, examples without a score column"),
    (["data=wiki1m", "data.download=null", "data.files=[training/partial/wiki1m_for_simcse.first11914lines.txt]"],
     ConfigError, "the data config gives single sentences"),
    (["data=stsb_pairs", "data.file=CONSTANT"], DataError, "every training pair scores 3 (data.file="),
]


@pytest.mark.parametrize(("overrides", "error", "message"), REFUSED_DATA)
def test_data_without_graded_scores_is_refused_before_loading(overrides, error, message, reference_model, stage_one,
                                                              real_data_root, tmp_path, monkeypatch):
    import promptemb.encoder.loading as loading

    monkeypatch.setattr(loading, "load_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    constant = stsb_file(tmp_path / "constant.csv", [3.0] * 40)
    cfg = compose_train(["experiment=quickstart_pcc_tuning_smollm2", f"backbone.name_or_path={reference_model}",
                         f"model.stage_one_adapter={stage_one}", f"data_root={real_data_root}",
                         f"output_dir={tmp_path / 'run'}", *[o.replace("CONSTANT", str(constant)) for o in overrides]])
    with pytest.raises(error) as caught:
        checked(cfg)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_the_experiments_pass_the_one_check(reference_model, stage_one, real_data_root, tmp_path, monkeypatch):
    import promptemb.encoder.loading as loading

    monkeypatch.setattr(loading, "load_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    for name in ("pcc_tuning", "quickstart_pcc_tuning_smollm2"):  # stage one here: float32 on the CPU
        cfg = compose_train([f"experiment={name}", f"backbone.name_or_path={reference_model}",
                             f"model.stage_one_adapter={stage_one}", "model.dtype=float32",
                             "trainer.accelerator=cpu", "trainer.precision=32-true",
                             f"data_root={real_data_root}", f"output_dir={tmp_path / name}"])
        assert checked(cfg).model["_target_"] == "promptemb.lightning_modules.pcc_tuning.PccTuning"
    paper = compose_train(["experiment=pcc_tuning", "model.stage_one_adapter=x"])
    assert (paper.data.batch_size, paper.optimizer.lr, paper.model.max_sentence_tokens, paper.trainer.max_epochs,
            paper.trainer.gradient_clip_val, paper.model.pearson, paper.model.train_sentence_rule) == (
        216, 5e-4, 64, 10, 1.0, "pcc_tuning", "none")
