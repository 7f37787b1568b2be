"""Evaluation spread over DDP ranks: each rank encodes a share of the batches, all exchange embeddings; the
embeddings and STS scores equal one process's exactly."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from tests.training.test_ddp import free_port


@pytest.mark.slow  # three processes scoring STS-B dev: ~45 s of CPU
def test_two_ranks_encode_and_score_exactly_like_one_process(tiny_bert, real_data_root, tmp_path):
    worker = str(REPO / "tests" / "sharded_eval_worker.py")
    out = str(tmp_path / "result")
    args = [str(tiny_bert), str(real_data_root)]
    subprocess.run([sys.executable, worker, "0", "1", "0", *args, f"{out}-single"], check=True, timeout=300)
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, worker, str(r), "2", str(port), *args, f"{out}-ddp"]) for r in range(2)]
    assert [p.wait(timeout=300) for p in ranks] == [0, 0]
    single = torch.load(f"{out}-single.0", weights_only=False)
    assert single["forwards"] == 6
    sharded = [torch.load(f"{out}-ddp.{rank}", weights_only=False) for rank in range(2)]
    assert [s["forwards"] for s in sharded] == [3, 3]  # batches 0, 2, 4 and 1, 3, 5
    for result in sharded:
        assert result["embeddings"].keys() == single["embeddings"].keys()
        for name, array in single["embeddings"].items():
            np.testing.assert_array_equal(result["embeddings"][name], array)
        assert result["scores"] == single["scores"]
