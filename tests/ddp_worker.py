"""Run by test_ddp.py in separate processes: InfoNCE over 2 gloo ranks vs one process on the joined batch."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.lightning_modules.losses import info_nce, world_size


def make_problem():
    torch.manual_seed(0)
    encoder = torch.nn.Linear(6, 4, dtype=torch.float64)
    inputs = torch.randn(3, 8, 6, dtype=torch.float64)  # anchors, positives, hard negatives of 8 examples
    return encoder, inputs


def loss_and_grad(encoder, inputs):
    anchors, positives, negatives = (encoder(x) for x in inputs)
    loss = info_nce(anchors, positives, 0.05, negatives)
    (loss * world_size()).backward()
    return loss.detach(), encoder.weight.grad.clone()


def main(rank: int, world: int, port: int, out: str) -> None:
    encoder, inputs = make_problem()
    if world == 1:
        loss, grad = loss_and_grad(encoder, inputs)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        local = inputs[:, rank * 4 : (rank + 1) * 4]
        loss, grad = loss_and_grad(encoder, local)
        dist.all_reduce(grad)
        grad /= world  # what DDP does
        dist.destroy_process_group()
    torch.save({"loss": loss, "grad": grad}, f"{out}.{rank}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
