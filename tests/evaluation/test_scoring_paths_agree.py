"""The training callback and evaluate.py score a checkpoint with the same bits: same encoder batching, same poolers,
same embeddings, same Spearman (the slow tests in test_evaluate_sources.py check it on a trained OptiPrompt run; this
one on a fresh checkpoint of the tiny BERT, fast). A row's float sums can depend on the shape of the batch it is
encoded in, so two paths that batch differently disagree in the last bits, and sometimes in a Spearman rank. Both
paths run in this process, so the same kernels sum in the same order: the comparison is exact on any CPU.

Both run the default CPU path (two batches at once, oneDNN-packed linears): it scores what the plain path scores,
and the callback's scoring leaves nothing behind in the module it scores or in the process."""

from __future__ import annotations

import hashlib
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.common.hydra_bridge import plain
from promptemb.encoder.model import BATCH_SIZE, InferenceOptions
from promptemb.evaluation.settings import EvaluateSettings
from promptemb.inference.runner import Evaluation
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from tests.conftest import REPO
from tests.encoder.test_cpu_fast_path import ENCODER_POOLERS
from tests.encoder.test_encoder import FORWARD_TOL
from tests.helpers import assert_close_scaled, module_checkpoint

TASK = "MANY-B"
WORDS = ["a", "man", "woman", "child", "dog", "cat", "plays", "reads", "runs", "sits", "on", "in", "the", "park",
         "field", "guitar", "book", "sofa", "while", "slowly", "quickly", "near", "two", "three", "old", "young", "red",
         "green", "small", "large", "house", "street", "car", "train", "plane", "night", "morning"]


def write_many_pairs(root: Path, pairs: int = 160, seed: int = 0) -> tuple[list[str], Path]:
    """An STS-B-format task of `pairs` random pairs (1-40 words: batches of several lengths, more sentences than one
    batch holds) and its registry; returns (the task's sentences, the registry file)."""
    rng = random.Random(seed)
    rows = [(" ".join(rng.choices(WORDS, k=rng.randint(1, 40))), " ".join(rng.choices(WORDS, k=rng.randint(1, 40))),
             f"{rng.uniform(0, 5):.3f}") for _ in range(pairs)]
    data = root / "downstream/STS/MANY/sts-test.csv"
    data.parent.mkdir(parents=True)
    data.write_text("".join(f"main\tMSRvid\t2012\t{i:04d}\t{gold}\t{a}\t{b}\n" for i, (a, b, gold) in enumerate(rows)))
    registry = root / "tasks.yaml"
    registry.write_text(yaml.safe_dump({"tasks": {TASK: {
        "format": "stsb", "split": "test", "pairs": pairs, "main_score": "spearman_cosine",
        "file": {"path": "downstream/STS/MANY/sts-test.csv", "sha256": hashlib.sha256(data.read_bytes()).hexdigest()},
    }}}, sort_keys=False))
    return list(dict.fromkeys(s for a, b, _ in rows for s in (a, b))), registry


def evaluate_py(checkpoint: Path, root: Path, registry: Path, out: Path, *overrides: str) -> Evaluation:
    """evaluate.py's objects for `python evaluate.py backbone.name_or_path=CKPT` with its default backbone group
    (`overrides`, e.g. other poolers, after the default `poolers=[mean]`)."""
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("eval", [f"backbone.name_or_path={checkpoint}", f"data_root={root}", f"task_registry={registry}",
                               f"tasks=[{TASK}]", "poolers=[mean]", "progress=false", "backbone.device=cpu",
                               f"output_dir={out}", *overrides])
    return Evaluation(EvaluateSettings.model_validate(plain(cfg)))


def test_callback_and_evaluate_py_score_a_checkpoint_with_the_same_bits(tiny_bert, tmp_path, two_threads):
    sentences, registry = write_many_pairs(tmp_path / "data")
    assert len(sentences) > 2 * BATCH_SIZE
    checkpoint = module_checkpoint(tiny_bert, tmp_path / "model.ckpt")
    callback = STSEvaluationCallback.from_config(output_dir=str(tmp_path / "run"), data_root=str(tmp_path / "data"),
                                                 task_registry=str(registry), final_tasks=[TASK], poolers=["mean"])
    module = load_module_checkpoint(checkpoint).module
    # the fit-end table (results.json) and a dev evaluation, as the callback runs them
    final, trained_encoder, trained_poolers, options = callback.score(module, [TASK], callback.extra_poolers,
                                                                      final=True)
    dev = callback.score(module, [TASK])[0]

    evaluation = evaluate_py(checkpoint, tmp_path / "data", registry, tmp_path / "evaluate")
    scoring = evaluation.scoring
    assert scoring.encoder.describe() == trained_encoder.describe()  # batching, kernels, dtype, attention ...
    assert (trained_encoder.parallel_batches, trained_encoder.onednn_linears) == (2, True)  # the CPU's defaults
    assert [p.name for p in scoring.poolers] == [p.name for p in trained_poolers] == ["mask", "avg", "mean"]
    assert (scoring.template.text, scoring.sentence_rule) == (options.template.text, options.sentence_rule)
    ours = scoring.encoder.embed(sentences, scoring.poolers, scoring.template, scoring.sentence_rule,
                                 scoring.max_sentence_tokens)
    theirs = trained_encoder.embed(sentences, trained_poolers, options.template, options.sentence_rule)
    for pooler in ("mask", "avg", "mean"):
        assert np.array_equal(ours[pooler], theirs[pooler]), pooler

    scores = evaluation.run()["scores"]
    for pooler in ("mask", "avg", "mean"):
        assert scores[pooler][TASK] == final["scores"][pooler][TASK]
    for pooler in ("mask", "avg"):  # the dev evaluation scores the module's own poolers the same way
        assert dev["scores"][pooler][TASK] == scores[pooler][TASK]


#: Spearman x 100 of two float-rounding-equal embeddings: equal unless a rounding flips the order of two cosines that
#: tie to float precision; one such swap among MANY-B's 160 pairs moves the score by at most 24 / 160^2 x 100 < 0.1.
SWAP_TOL = 0.1


def test_the_default_fast_path_scores_what_the_plain_path_scores(tiny_bert, tmp_path, two_threads):
    """evaluate.py as composed by its config (the default backbone group: `parallel_batches` and `onednn_linears`
    auto) against the same command with `backbone.parallel_batches=1 backbone.onednn_linears=false`: every encoder
    pooler family (idf fitted on the task, attention-reading ditto, all-layer sbert_wk, the MLM head's mask_topk) and
    a post-processor score the same."""
    _, registry = write_many_pairs(tmp_path / "data")
    poolers = [*ENCODER_POOLERS, "idf", "avg_idf"]
    overrides = (f"poolers=[{','.join(poolers)}]", "template=promptbert_bert", "post=[zscore]",
                 "+pooler_args.ditto.head=1", "+pooler_args.sbert_wk.layer_start=1")
    runs = {}
    for label, backbone in (("default", ()), ("plain", ("backbone.parallel_batches=1",
                                                        "backbone.onednn_linears=false"))):
        evaluation = evaluate_py(tiny_bert, tmp_path / "data", registry, tmp_path / label, *overrides, *backbone)
        runs[label] = (evaluation.scoring.encoder.describe(), evaluation.run())
    (fast, default), (slow, plain_run) = runs["default"], runs["plain"]
    assert (fast["parallel_batches"], fast["linear_kernels"]) == (2, "onednn_packed")
    assert (slow["parallel_batches"], slow["linear_kernels"]) == (1, "default")
    assert default["provenance"]["model"]["linear_kernels"] == "onednn_packed"
    assert sorted(default["scores"]) == sorted(plain_run["scores"]) and len(default["scores"]) == 2 * len(poolers)
    for row, scores in plain_run["scores"].items():
        assert default["scores"][row][TASK] == pytest.approx(scores[TASK], abs=SWAP_TOL), row


def test_the_callback_scoring_leaves_nothing_behind_for_training(tiny_bert, tmp_path, two_threads):
    """A dev evaluation during training (the default CPU path: packed linears, batches in threads) leaves the module
    with its own linears and parameters (the same objects), the torch threads as they were and no worker thread; the
    training step after it computes the bits (loss and every gradient) it computes without the evaluation. After an
    optimiser step the next evaluation scores the new weights (no stale packed copy): the plain path's embeddings."""
    _, registry = write_many_pairs(tmp_path / "data")
    checkpoint = module_checkpoint(tiny_bert, tmp_path / "model.ckpt")
    callback = STSEvaluationCallback.from_config(output_dir=str(tmp_path / "run"), data_root=str(tmp_path / "data"),
                                                 task_registry=str(registry), dev_task=TASK, final_tasks=[TASK])
    batch = [" ".join(random.Random(i).choices(WORDS, k=3 + i)) for i in range(6)]

    def training_step(module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        module.train()
        module.zero_grad()
        torch.manual_seed(0)
        loss = module.contrastive_objective(*module.contrastive_views(batch))
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}

    expected_loss, expected_grads = training_step(load_module_checkpoint(checkpoint).module)
    module = load_module_checkpoint(checkpoint).module
    modules, parameters = list(module.modules()), list(module.parameters())
    threads, alive = torch.get_num_threads(), threading.active_count()
    _, encoder, poolers, options = callback.score(module, [TASK])
    assert (encoder.parallel_batches, encoder.onednn_linears) == (2, True)
    assert list(module.modules()) == modules and list(module.parameters()) == parameters
    assert torch.get_num_threads() == threads and threading.active_count() == alive
    loss, grads = training_step(module)
    assert torch.equal(loss, expected_loss) and grads.keys() == expected_grads.keys() and grads
    assert all(torch.equal(grads[name], expected_grads[name]) for name in grads)

    sentences = batch * 3
    before = encoder.embed(sentences, poolers, options.template, options.sentence_rule)
    torch.optim.SGD(module.parameters(), lr=1.0).step()
    after = callback.score(module, [TASK])[1].embed(sentences, poolers, options.template, options.sentence_rule)
    module.eval()
    reference = module.evaluation_encoder()
    reference.use_inference_options(InferenceOptions(parallel_batches=1, onednn_linears=False))
    expected = reference.embed(sentences, poolers, options.template, options.sentence_rule)
    for pooler in expected:
        assert_close_scaled(after[pooler], expected[pooler], FORWARD_TOL, msg=pooler)
        assert np.abs(after[pooler] - before[pooler]).max() > 100 * FORWARD_TOL * np.abs(before[pooler]).max()
