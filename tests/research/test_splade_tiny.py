"""A real MLM head (`model:splade-tiny`, docs/research.md "A real MLM head"): what the PromptBERT template's [MASK]
predicts, the `mask_topk` pooler, and the untrained STS-B scores, each against transformers' own MLM forward or the
documented run. Slow; skipped when splade-tiny is not fetched (`promptemb-models fetch splade-tiny`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import BertForMaskedLM

from promptemb.encoder.model import Encoder
from promptemb.encoder.model_store import is_fetched, models_root
from promptemb.encoder.template import Template
from promptemb.poolers.registry import build_pooler
from promptemb.research.mask_predictions import DEFAULT_TEMPLATE, predict
from tests.conftest import REPO

pytestmark = pytest.mark.slow

SENTENCES = ["a man is playing a guitar .", "the stock market fell sharply on monday ."]


@pytest.fixture(scope="module")
def folder():
    path = models_root() / "splade-tiny"
    if not is_fetched(path):
        pytest.skip(f"model:splade-tiny is not fetched in {models_root()} (promptemb-models fetch splade-tiny)")
    return path


@pytest.fixture(scope="module")
def splade(folder) -> Encoder:
    return Encoder("model:splade-tiny", batch_size=2, mlm_head=True, progress=False)


def mlm_probabilities(folder, tokenizer, sentence: str) -> torch.Tensor:
    """transformers' BertForMaskedLM on the filled-in template: the softmax at [MASK] (float64)."""
    model = BertForMaskedLM.from_pretrained(folder).eval()
    ids = tokenizer(DEFAULT_TEMPLATE.replace("[X]", sentence))["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, ids.index(tokenizer.mask_token_id)]
    return torch.softmax(logits.double(), -1)


def test_mask_predictions_are_the_real_mlm_heads(splade, folder):
    rows = predict(splade, SENTENCES, Template(DEFAULT_TEMPLATE), top_k=10)
    for row, sentence in zip(rows, SENTENCES):
        top = torch.topk(mlm_probabilities(folder, splade.tokenizer, sentence), 10)
        assert [p["token"] for p in row["predictions"]] == splade.tokenizer.convert_ids_to_tokens(top.indices.tolist())
        np.testing.assert_allclose([p["probability"] for p in row["predictions"]], top.values.numpy(), rtol=1e-4)
    # the documented table (results/research/splade_tiny/mask_predictions): "means" first, at a low probability
    assert [(p["token"], round(p["probability"], 3)) for p in rows[0]["predictions"][:2]] == [("means", 0.052),
                                                                                             ("song", 0.011)]
    assert [(p["token"], round(p["probability"], 3)) for p in rows[1]["predictions"][:2]] == [("means", 0.032),
                                                                                             (".", 0.007)]


def test_mask_topk_is_the_probability_weighted_static_embedding_of_the_top_tokens(splade, folder):
    got = splade.embed(SENTENCES, [build_pooler("mask_topk", k=100)], Template(DEFAULT_TEMPLATE))["mask_topk"]
    table = BertForMaskedLM.from_pretrained(folder).get_input_embeddings().weight.detach().double()
    for row, sentence in enumerate(SENTENCES):
        top = torch.topk(mlm_probabilities(folder, splade.tokenizer, sentence), 100)
        want = (top.values[:, None] * table[top.indices]).sum(0) / top.values.sum()
        np.testing.assert_allclose(got[row], want.numpy(), atol=2e-5, rtol=1e-4)


def test_untrained_sts_b_scores_are_the_documented_ones(folder, real_data_root, tmp_path):
    """evaluate.py on `model:splade-tiny` with the PromptBERT template, STS-B test alone: the STS-B column of the
    7-task run in docs/research.md (results/research/splade_tiny/sts), within 0.01 (the batches hold other
    sentences when STS-B is scored alone)."""
    out = tmp_path / "sts"
    env = {**os.environ, "PROMPTEMB_DATA": str(real_data_root)}
    proc = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "backbone.name_or_path=model:splade-tiny",
                           "poolers=[mean,mask,mask_topk]", "template=promptbert_bert", "tasks=[STSBenchmark]",
                           "progress=false", f"output_dir={out}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    documented = json.loads((REPO / "results/research/splade_tiny/sts/results.json").read_text())
    measured = json.loads((out / "results.json").read_text())
    for pooler in ("mean", "mask", "mask_topk"):
        assert sts_b(measured, pooler) == pytest.approx(sts_b(documented, pooler), abs=0.01), pooler


def sts_b(results: dict, pooler: str) -> float:
    return results["scores"][pooler]["STSBenchmark"]
