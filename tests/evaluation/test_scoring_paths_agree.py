"""The training callback and evaluate.py score a checkpoint with the same bits: same encoder batching, same poolers,
same embeddings, same Spearman (the slow tests in test_evaluate_sources.py check it on a trained OptiPrompt run; this
one on a fresh checkpoint of the tiny BERT, fast). A row's float sums can depend on the shape of the batch it is
encoded in, so two paths that batch differently disagree in the last bits, and sometimes in a Spearman rank. Both
paths run in this process, so the same kernels sum in the same order: the comparison is exact on any CPU."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import yaml
from hydra import compose, initialize_config_dir

from promptemb.callbacks.sts_evaluation import STSEvaluationCallback
from promptemb.common.hydra_bridge import plain
from promptemb.encoder.model import BATCH_SIZE
from promptemb.evaluation.settings import EvaluateSettings
from promptemb.inference.runner import Evaluation
from promptemb.lightning_modules.checkpoint import load_module_checkpoint
from tests.conftest import REPO
from tests.helpers import module_checkpoint

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


def evaluate_py(checkpoint: Path, root: Path, registry: Path, out: Path) -> Evaluation:
    """evaluate.py's objects for `python evaluate.py backbone.name_or_path=CKPT` with its default backbone group."""
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("eval", [f"backbone.name_or_path={checkpoint}", f"data_root={root}", f"task_registry={registry}",
                               f"tasks=[{TASK}]", "poolers=[mean]", "progress=false", "backbone.device=cpu",
                               f"output_dir={out}"])
    return Evaluation(EvaluateSettings.model_validate(plain(cfg)))


def test_callback_and_evaluate_py_score_a_checkpoint_with_the_same_bits(tiny_bert, tmp_path):
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
