"""all-MiniLM-L6-v2 `mean` scores equal sentence-transformers' EmbeddingSimilarityEvaluator (cosine Spearman)."""

import subprocess
import sys

import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

from promptemb.data.tasks import get_tasks
from promptemb.encoder.loading import resolve_model_path
from promptemb.encoder.model import Encoder
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_poolers
from tests.conftest import REPO
from tests.helpers import MINILM


@pytest.mark.slow
def test_minilm_mean_matches_sentence_transformers_on_stsb(real_data_root):
    tasks = get_tasks(["STSBenchmark"])
    ours = evaluate_sts(Encoder(MINILM, max_length=256, progress=False), tasks, real_data_root,
                        build_poolers(["mean"]))["scores"]["mean"]["STSBenchmark"]
    pairs = tasks[0].load(real_data_root)
    evaluator = EmbeddingSimilarityEvaluator(pairs.sentences1, pairs.sentences2, pairs.gold, name="stsb",
                                             similarity_fn_names=["cosine"])
    theirs = 100 * evaluator(SentenceTransformer(resolve_model_path(MINILM), device="cpu"))["stsb_spearman_cosine"]
    assert ours == pytest.approx(theirs, abs=0.01)
    assert ours == pytest.approx(82.03, abs=0.01)  # published all-MiniLM-L6-v2 STS-B test score


@pytest.mark.slow
def test_all_seven_tasks_match_sentence_transformers(real_data_root):
    proc = subprocess.run([sys.executable, "scripts/compare_sentence_transformers.py", "--data-root",
                           str(real_data_root)], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "max abs diff" in proc.stdout
