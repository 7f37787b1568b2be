"""2-process DDP on CPU (gloo): same loss and gradient as one process on the joined batch."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.training.test_train import WIKI_SAMPLE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_and_two_ranks(worker: str, out: str) -> tuple[dict, list[dict]]:
    """Run the worker script `tests/<worker>` (argv: rank, world size, port, output prefix) as one process and as 2
    gloo ranks; what the single process and each rank saved."""
    script = str(REPO / "tests" / worker)
    subprocess.run([sys.executable, script, "0", "1", "0", f"{out}-single"], check=True, timeout=120)
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, script, str(r), "2", str(port), f"{out}-ddp"]) for r in range(2)]
    assert [p.wait(timeout=120) for p in ranks] == [0, 0]
    return torch.load(f"{out}-single.0"), [torch.load(f"{out}-ddp.{rank}") for rank in range(2)]


def test_two_ranks_equal_one_process_on_joined_batch(tmp_path):
    single, ranks = single_and_two_ranks("ddp_worker.py", str(tmp_path / "result"))
    for ddp in ranks:
        # float64 but for InfoNCE's fp32 logits, which every process computes from the same gathered [8, D] batch
        # with the same kernels on this machine: the same bits; the rest differs by float64 round-off only
        torch.testing.assert_close(ddp["loss"], single["loss"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ddp["grad"], single["grad"], rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["quickstart_unsup", "quickstart_sup"])
def test_train_py_runs_two_process_ddp_on_cpu(experiment, tiny_bert, real_data_root, tmp_path):
    """The real entry point under DDP (gloo, 2 CPU processes): unused trainable parameters (the [CLS] pooler, an
    MLM decoder) would fail DDP at its second step; only rank 0 scores dev and broadcasts, both ranks see the same
    numbers, one results.json. (quickstart_sup trains on the 494 SICK triplets of the data root.)"""
    out = tmp_path / "out"
    overrides = [f"experiment={experiment}", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                 "trainer.precision=32-true", f"backbone.name_or_path={tiny_bert}", f"data_root={real_data_root}",
                 f"output_dir={out}", "data.batch_size=4", "data.num_workers=0", "trainer.max_steps=4",
                 "eval_every_n_steps=2", "callbacks.sts_evaluation.final_tasks=[STSBenchmark]"]
    if experiment == "quickstart_unsup":
        overrides += ["data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "train.py", *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = json.loads((out / "curve.json").read_text())["points"]
    assert [p["step"] for p in points] == [0, 2, 4]
    logged = [line for line in (proc.stdout + proc.stderr).splitlines() if "step 2: mask" in line]
    assert len(logged) == 2 and len({line.split(" - ")[-1] for line in logged}) == 1  # both ranks, same numbers
    results = json.loads((out / "results.json").read_text())
    assert results["provenance"]["config"]["trainer"]["strategy"] == "ddp"
    assert -100 <= results["scores"]["mask"]["STSBenchmark"] <= 100
    assert (out / "checkpoints" / "last.ckpt").is_file()
