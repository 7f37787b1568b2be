"""Every bench in bench/ runs to completion on tiny settings and prints its figures (bench/train_throughput.py:
tests/repository/test_train_throughput.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers import save_tiny_bert


@pytest.fixture(scope="module")
def tiny6(tmp_path_factory) -> Path:
    """6 layers and 12 heads: every pooler's defaults fit (sbert_wk from layer 4, the Ditto head 0/8 of the docs)."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny6"), layers=6, heads=12, hidden=48)


def bench(script: str, *args: str, data_root: Path | None = None) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if data_root is not None:
        env["PROMPTEMB_DATA"] = str(data_root)
    proc = subprocess.run([sys.executable, f"bench/{script}", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_sbert_wk_speed(tiny6, real_data_root):
    out = bench("sbert_wk_speed.py", "--model", tiny6, "--sentences", 24, data_root=real_data_root)
    assert re.search(r"^24 sentences, \d+ tokens, 3 layers \(from 4\)", out, re.M)
    assert re.search(r"batched \(gram, default\) .* speed-up +[\d.]+x", out)
    gram, qr = map(float, re.search(r"max abs diff vs loop: gram (\S+), qr (\S+) ", out).groups())
    assert gram < 1e-8 and qr < 1e-8  # the batched pooler equals the per-token loop


@pytest.mark.slow
def test_pooler_suite_cost(tiny6, mini_data):
    root, registry = mini_data
    out = bench("pooler_suite_cost.py", "--model", tiny6, "--tasks", "MINI-B", "MINI12", "--data-root", root,
                "--task-registry", registry, "--threads", 1)
    assert "left out: mask_topk (needs an MLM head); token_avg (needs a named corpus" in out
    sequences = [int(n) for n in re.findall(r"\((\d+) sequences through the transformer\)", out)]
    assert len(sequences) == 3 and sequences[1] == sequences[2] == 2 * sequences[0]  # plain + templated forms
    assert re.search(r"all / mask alone += [\d.]+x CPU time", out)


@pytest.mark.slow
def test_denoising_step_time(tiny6, real_data_root):
    out = bench("denoising_step_time.py", "--model", tiny6, "--batch-size", 4, "--steps", 2, "--rounds", 1,
                "--threads", 1, data_root=real_data_root)
    rows = re.findall(r"s/step +([\d.]+)x +CPU +[\d.]+ s/step +([\d.]+)x", out)
    assert len(rows) == 4 and rows[0] == ("1.00", "1.00")  # wall and CPU ratios, against the step without denoising


@pytest.mark.slow
def test_encode_throughput(tiny6, real_data_root):
    out = bench("encode_throughput.py", "--model", tiny6, "--sentences", 40, "--repeats", 1,
                data_root=real_data_root)
    assert re.search(r"^eager +[\d.]+ sentences/s", out, re.M)
    assert re.search(r"speed-up eager [\d.]+x", out) and re.search(r"speed-up compiled [\d.]+x", out)
    assert re.search(r"speed-up parallel_batches=2 [\d.]+x;", out)
    assert re.search(r"speed-up parallel_batches=2 \+ onednn_linears [\d.]+x; vs its defaults", out)
    assert re.search(r"speed-up defaults [\d.]+x \(goal >= 1\.5x\); vs its defaults [\d.]+x; max abs diff of unit "
                     r"embeddings [\d.e+-]+$", out, re.M)
    assert re.search(r"^max_batch_tokens=16384 +[\d.]+ sentences/s", out, re.M)
    assert re.search(r"^sentence-transformers defaults +[\d.]+ sentences/s", out, re.M)
    assert re.search(r"^goal: the project's defaults vs SentenceTransformer\.encode's defaults on cpu: [\d.]+x", out,
                     re.M)
    # on the CPU the defaults resolve to the fast exact path (two batches at once where there are two torch threads)
    assert re.search(r"the project's defaults: 64 inputs per batch, [12] at once, onednn_packed linears$", out, re.M)
    assert re.search(r"^compiled +[\d.]+ sentences/s .*first call", out, re.M)


@pytest.mark.slow
def test_evaluation_suite(tiny6, real_data_root, tmp_path):
    """One evaluate.py process for all three families; the split adds up to the process wall time."""
    report = tmp_path / "suite.json"
    out = bench("evaluation_suite.py", "--model", tiny6, "--tasks", "STSBenchmark,TREC,tweet", "--threads", 1,
                "--output", report,
                "+family_args.transfer.kfold=2", "+family_args.transfer.max_epoch=4",
                "+family_args.clustering.trials=2", "+family_args.clustering.n_init=2", data_root=real_data_root)
    assert re.search(r"^evaluate\.py process wall [\d.]+ s", out, re.M)
    for family, scoring in (("sts", "STS scoring"), ("transfer", "classifiers"), ("clustering", "k-means")):
        assert re.search(rf"^  {family} +encoding +[\d.]+ s +{scoring} +[\d.]+ s$", out, re.M)
    assert re.search(r"sentences/s\); classifiers \+ k-means \+ STS scoring [\d.]+ s = [\d.]+x encoding", out)
    figures = json.loads(report.read_text())
    split = figures["split"]
    parts = split["start_up_s"] + split["load_and_report_s"] + split["encode_s"] + split["score_s"]
    assert abs(parts - split["process_wall_s"]) < 0.5 and split["device"] == "cpu"
    assert set(figures["scores"]) == {"sts", "transfer", "clustering"}
    assert set(figures["scores"]["clustering"]["mean"]) == {"tweet", "avg"}


@pytest.mark.slow
def test_scorer_ab(tiny6, real_data_root, tmp_path):
    """The A/B of the scorers, this checkout against itself: identical scores, embeddings cached for the next run."""
    args = ("--baseline", REPO, "--tasks", "SICK-E", "tweet", "--model", tiny6, "--cache", tmp_path, "--threads", 1)
    out = bench("scorer_ab.py", *args, data_root=real_data_root)
    for task in ("SICK-E", "tweet"):
        assert re.search(rf"^{task} +CPU ratio baseline / this [\d.]+x; scores identical$", out, re.M)
    assert re.search(r"^SICK-E +this +[\d.]+ s wall +[\d.]+ s CPU  accuracy [\d.]+, \d+ steps$", out, re.M)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["SICK-E.mean.npy", "tweet.mean.npy"]


@pytest.mark.slow
def test_decoder_method_cost(real_data_root, tmp_path):
    from tests.decoder_helpers import save_tiny_decoder

    model = save_tiny_decoder(tmp_path / "tiny-llama", "llama")
    out = bench("decoder_method_cost.py", "--model", model, "--sentences", 16, "--batch-size", 8,
                data_root=real_data_root)
    rows = dict(re.findall(r"^\| (\w+) \| [\d.]+ \| [\d.]+ \| [\d.]+x \| ([\d.]+)x \|$", out, re.M))
    assert set(rows) == {"prompteol", "pcot", "ke", "metaeol", "echo", "token_prepending", "contrastive_prompting"}
    assert rows["prompteol"] == "1.00"



@pytest.mark.slow
def test_train_throughput_rehearses_the_gpu_command_on_the_cpu(tiny_bert, real_data_root, tmp_path):
    """The GPU command (`experiment=promptbert_unsup trainer=gpu`, bf16-mixed, `trainer.compile=true`) with a tiny
    BERT, the local corpus and 2 steps on the CPU: the real loop (compiled as train.py compiles it) and the phases."""
    from tests.training.test_train import WIKI_SAMPLE

    report = tmp_path / "throughput.json"
    out = bench("train_throughput.py", "experiment=promptbert_unsup", "trainer=gpu", "trainer.compile=true",
                f"backbone.name_or_path={tiny_bert}", "data.download=null", f"data.files=[{WIKI_SAMPLE}]",
                "data.batch_size=8", "data.max_examples=64", f"data.cache_dir={tmp_path}", "--steps", 2, "--warmup", 1,
                "--device", "cpu", "--peak-tflops", 1, "--out", report, data_root=real_data_root)
    assert "loop (train.py's, no synchronisation inside)" in out and "phases (step written out" in out
    result = json.loads(report.read_text())
    assert result["setup"]["compile"] and result["setup"]["precision"] == "bf16-mixed"
    assert result["measured_by"] == "loop" and result["loop"]["steps"] == 2 and result["loop"]["warmup_seconds"] > 0
    assert result["loop"]["model_flops_per_step"] == result["phases"]["model_flops_per_step"] > 0




@pytest.mark.slow
def test_corpus_preparation(real_data_root):
    out = bench("corpus_preparation.py", "--lines", 3000, 60000, "--processes", 2, data_root=real_data_root)
    assert re.search(r"^ +60,000 lines \([\d.]+ GiB\), 6 held-out lines dropped", out, re.M)
    prepare = re.findall(r"prepare +[\d.]+ s wall .*peak over (\d+) processes: RSS ([\d.]+) GiB", out)
    assert len(prepare) == 2 and int(prepare[1][0]) == 3  # the main process and its 2 workers at 60,000 lines
    assert len(re.findall(r"training start +[\d.]+ s wall", out)) == 2
