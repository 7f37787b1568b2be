"""2-process DDP on CPU (gloo): same loss and gradient as one process on the joined batch."""

import socket
import subprocess
import sys

import torch

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_equal_one_process_on_joined_batch(tmp_path):
    out = str(tmp_path / "result")
    worker = str(REPO / "tests" / "ddp_worker.py")
    subprocess.run([sys.executable, worker, "0", "1", "0", f"{out}-single"], check=True, timeout=120)
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, worker, str(r), "2", str(port), f"{out}-ddp"]) for r in range(2)]
    assert [p.wait(timeout=120) for p in ranks] == [0, 0]
    single = torch.load(f"{out}-single.0")
    for rank in range(2):
        ddp = torch.load(f"{out}-ddp.{rank}")
        torch.testing.assert_close(ddp["loss"], single["loss"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ddp["grad"], single["grad"], rtol=1e-10, atol=1e-12)
