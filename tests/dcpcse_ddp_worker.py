"""Run by tests/lightning_modules/test_dcpcse.py in separate processes: DCPCSE's objective (InfoNCE with hard
negatives plus the energy-based hinge loss, `dcpcse.dcpcse_objective`) over 2 gloo ranks vs one process on the joined
batch."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.lightning_modules.dcpcse import dcpcse_objective
from promptemb.lightning_modules.losses import world_size


def main(rank: int, world: int, out: str) -> None:
    torch.manual_seed(0)
    encoder = torch.nn.Linear(6, 8)
    inputs = torch.randn(3, 8, 6)  # (anchor, positive, negative) x 8 examples
    if world > 1:
        inputs = inputs[:, rank * 4 : (rank + 1) * 4]
    anchors, positives, negatives = (encoder(x) for x in inputs)
    # the hinge is active on these rows (1.17 on the joined batch), so the comparison covers it
    loss = dcpcse_objective(anchors, positives, negatives, 0.05, 10.0, 0.2)
    (loss * world_size()).backward()
    grad = encoder.weight.grad.clone()
    if world > 1:
        dist.all_reduce(grad)
        grad /= world  # what DDP does
    torch.save({"loss": loss.detach(), "grad": grad}, f"{out}.{rank}")


if __name__ == "__main__":
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    main(rank, world, out)
    if world > 1:
        dist.destroy_process_group()
