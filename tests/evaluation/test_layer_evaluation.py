"""Scoring at earlier layers (evaluate.py `layers=[...]`, a model trained with adaptive layers): every pooler on the
model cut after each layer, from the same forward, equal to the pooler on a model whose layer list stops there; with
`dims`, the layers x widths table; depths the model cannot give and poolers that cannot be cut are refused in one
line before any forward."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoModel, AutoTokenizer

from promptemb.common.errors import ConfigError
from promptemb.common.hydra_bridge import plain
from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.settings import EvaluateSettings
from promptemb.evaluation.sts import evaluate_sts
from promptemb.lightning_modules.matryoshka import LayerPlan, split_depths
from promptemb.lightning_modules.promptbert import PromptBERTSup
from promptemb.poolers import build_pooler, build_poolers
from promptemb.poolers.truncated import TruncatedPooler, at_depths
from tests.conftest import REPO
from tests.evaluation.test_evaluate_cli import evaluate
from tests.evaluation.test_matryoshka_evaluation import cosine_spearman
from tests.helpers import assert_close_scaled, assert_one_line_error
from tests.lightning_modules.test_grad_cache import TRIPLETS, make

TEMPLATE = Template('This sentence : "[X]" means [MASK] .')
SENTENCES = ["a man plays a guitar .", "short", "two dogs run in a field while a plane lands at night", ""]


def cut_encoder(path, depth: int) -> Encoder:
    """The tiny BERT with its layer list cut after `depth` (sentence-transformers' way of serving fewer layers)."""
    model = AutoModel.from_pretrained(path)
    model.encoder.layer = model.encoder.layer[:depth]
    model.config.num_hidden_layers = depth
    return Encoder.from_model(model.eval(), AutoTokenizer.from_pretrained(path), name=f"{path}[:{depth}]")


@pytest.mark.parametrize("name", ["mask", "mask_denoised", "avg", "mean", "first_last", "cls", "sbert_wk"])
def test_a_pooler_at_a_depth_equals_it_on_the_model_cut_there(tiny_bert, name):
    encoder = Encoder(str(tiny_bert), progress=False)
    for depth in {"first_last": (2, 1), "sbert_wk": (2,)}.get(name, (2, 1, 0)):
        pooler = build_pooler(name) if name != "sbert_wk" else build_pooler(name, layer_start=0)
        truncated = TruncatedPooler(pooler, depth)
        got = encoder.embed(SENTENCES, [truncated], TEMPLATE)[truncated.name]
        want = cut_encoder(tiny_bert, depth).embed(SENTENCES, [pooler], TEMPLATE)[pooler.name]
        # the same float32 kernels over the same first layers (a one-layer cut also drops nothing it reads)
        assert_close_scaled(got, want, 1e-6, msg=f"{name} at layer {depth}")


def test_a_one_layer_pooler_at_a_depth_is_the_registrys_name_at_that_layer(tiny_bert):
    encoder = Encoder(str(tiny_bert), progress=False)
    poolers = [TruncatedPooler(build_pooler("mask"), 1), build_pooler("mask@1")]
    assert [p.name for p in poolers] == ["mask@1", "mask@1"] and poolers[0].needs == poolers[1].needs
    embedded = [encoder.embed(SENTENCES, [pooler], TEMPLATE)[pooler.name] for pooler in poolers]
    np.testing.assert_array_equal(*embedded)


def test_the_training_views_at_a_depth_are_what_evaluation_scores_there(tiny_bert):
    """One code path: PromptBERT sup's own pooler (denoised [MASK] through its head) cut after layer l, as
    evaluate.py scores a checkpoint's, equals the recipe's training views at depth l (eval mode: no dropout)."""
    random.seed(0)
    module = make("sup", tiny_bert, adaptive_layers={"n_layers_per_step": -1}).eval()  # float64: [MASK] minus
    # bias cancels most of each state, and fp32 round-off of the terms would dominate the small difference
    module.layer_plan = LayerPlan(3, (0, 1, 2), (None,) * 4)
    with torch.no_grad():
        views = split_depths(module.training_views(TRIPLETS), 4)
    encoder = module.evaluation_encoder()
    sentences = [triplet[0] for triplet in TRIPLETS]
    for depth, depth_views in zip(module.layer_plan.depths, views, strict=True):
        pooler = TruncatedPooler(module.pooler, depth) if depth < 3 else module.pooler
        got = encoder.embed(sentences, [pooler], module.eval_template)[pooler.name]
        assert_close_scaled(got, depth_views[0].float().numpy(), 1e-5, msg=f"layer {depth}")


def test_rows_at_each_layer_and_width_are_the_truncated_embeddings_scored(tiny_bert, mini_data):
    root, registry_file = mini_data
    tasks = get_tasks(["MINI12", "MINI-B"], load_registry(registry_file))
    encoder = Encoder(str(tiny_bert), progress=False)
    poolers = at_depths(build_poolers(["mean", "mask"]), [1, 2], 3)
    result = evaluate_sts(encoder, tasks, root, poolers, ScoringOptions(TEMPLATE, dims=(16, 8)))
    plain = Encoder(str(tiny_bert), progress=False)
    evaluate_sts(plain, tasks, root, build_poolers(["mean", "mask"]), ScoringOptions(TEMPLATE))
    assert encoder.stats.forward_sequences == plain.stats.forward_sequences  # the depths cost no forward
    assert list(result["scores"]) == [
        "mean", "mean@16", "mean@8", "mean@2", "mean@2@16", "mean@2@8", "mean@1", "mean@1@16", "mean@1@8",
        "mask", "mask@16", "mask@8", "mask@2", "mask@2@16", "mask@2@8", "mask@1", "mask@1@16", "mask@1@8"]
    pairs = tasks[1].load(root)
    for name, template in (("mean", None), ("mask", TEMPLATE)):
        cut = cut_encoder(tiny_bert, 1)
        left, right = (cut.embed(side, build_poolers([name]), template)[name]
                       for side in (pairs.sentences1, pairs.sentences2))
        expected = cosine_spearman(left[:, :8], right[:, :8], pairs.gold_array())
        assert result["scores"][f"{name}@1@8"]["MINI-B"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("make_poolers", "message"), [
    (lambda: at_depths(build_poolers(["mean"]), [1, 3], 3),
     "layers=[1, 3]: the model has 3 layers, so a layer to cut after is one of 0 (the embedding output) .. 2 (the "
     "whole model is each pooler's own row); 3 is not"),
    (lambda: at_depths(build_poolers(["ditto"]), [1], 3), "pooler 'ditto' reads attentions, so it is not scored at "
                                                          "an earlier layer"),
    (lambda: at_depths(build_poolers(["static"]), [1], 3), "pooler 'static' reads word-embedding rows"),
    (lambda: at_depths(build_poolers(["mask@2"]), [1], 3), "pooler 'mask@2' names its layer, and layers=[...] cuts "
                                                           "the model under every pooler: list 'mask' instead"),
    (lambda: TruncatedPooler(build_pooler("first_last"), 0), "pooler 'first_last' at layer 0: layer 1 is out of "
                                                             "range for a model with 0 layers"),
])
def test_poolers_and_depths_that_cannot_be_cut_are_refused(make_poolers, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        make_poolers()


def sup_2d_checkpoint(model, path):
    """A train.py-style checkpoint of a fresh PromptBERTSup trained with adaptive layers (denoised [MASK] through its
    MLM-transform head), written without training: what evaluate.py opens with the recipe's own poolers."""
    module = PromptBERTSup(str(model), adaptive_layers={"n_layers_per_step": 1}, matryoshka_dims=[32, 16])
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), "global_step": 0}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


def test_evaluate_cli_scores_a_trained_models_layers_by_widths_table(mini_data, tiny_bert, tmp_path):
    """A checkpoint's own poolers (its headed, denoised [MASK] and avg) at every depth and width: the rows, their
    provenance and the 2D table of results.md; a layer the model does not have: one line, nothing written."""
    root, registry = mini_data
    checkpoint = sup_2d_checkpoint(tiny_bert, tmp_path / "sup_2d.ckpt")
    common = [f"backbone.name_or_path={checkpoint}", "poolers=[avg]", "tasks=[MINI12,MINI-B]",
              f"task_registry={registry}"]
    out = tmp_path / "out"
    proc = evaluate(*common, "dims=[16]", "layers=[2,1]", f"output_dir={out}", data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    scores = results["scores"]
    assert list(scores) == ["mask", "mask@16", "mask@2", "mask@2@16", "mask@1", "mask@1@16",
                            "avg", "avg@16", "avg@2", "avg@2@16", "avg@1", "avg@1@16"]
    assert results["provenance"]["layers"] == [2, 1]
    poolers = results["provenance"]["poolers"]
    assert {name: p.get("depth") for name, p in poolers.items()} == {
        "mask": None, "mask@2": 2, "mask@1": 1, "avg": None, "avg@2": 2, "avg@1": 1}
    assert poolers["mask@1"]["head"] == "MLMTransformHead" and poolers["mask@1"]["denoise"]
    report = (out / "results.md").read_text()
    assert "mask, average over the tasks:\n\n| layers | full width | 16 |" in report
    assert f"| 1..1 | {scores['mask@1']['avg']:.2f} | {scores['mask@1@16']['avg']:.2f} |" in report
    refused = tmp_path / "refused"
    assert_one_line_error(evaluate(*common, "layers=[3]", f"output_dir={refused}", data_root=root),
                          re.escape("layers=[3]: the model has 3 layers"), refused, status=2)


@pytest.mark.parametrize(("overrides", "message"), [
    (["dims=[16]", "layers=[16]"], "layers=[16] and dims=[16] share 16: rows pooler@16 would be the pooler at that "
                                   "layer and at that width alike"),
    (["layers=[1,1]"], "layers=[1, 1] lists a layer twice"),
    (["layers=[-1]"], "layers=[-1]: Input should be greater than or equal to 0"),
])
def test_evaluate_settings_refuse_bad_layers_before_the_model_loads(overrides, message, tmp_path):
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("eval", [f"output_dir={tmp_path / 'out'}", *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)):
        EvaluateSettings.model_validate(plain(cfg))
