"""Run by tests/lightning_modules/test_angle_recipe.py in separate processes: the AnglE objective of the global batch
(`angle_recipe.global_objective`) over 2 gloo ranks vs one process on the joined batch, for scored pairs and for
triplets."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.lightning_modules.angle_objective import README_STSB_WEIGHTS, AnglEObjective
from promptemb.lightning_modules.angle_recipe import global_objective
from promptemb.lightning_modules.losses import world_size


def loss_and_grad(encoder, inputs, scores):
    views = [encoder(x) for x in inputs]
    if scores is None:
        loss = global_objective(AnglEObjective(cosine_w=0.5), views, None)
    else:
        loss = global_objective(AnglEObjective(**README_STSB_WEIGHTS, cln_w=0.0), views, scores)
    (loss * world_size()).backward()
    return loss.detach(), encoder.weight.grad.clone()


def main(rank: int, world: int, port: int, out: str) -> None:
    results = {}
    for kind, members in (("pairs", 2), ("triplets", 3)):
        torch.manual_seed(0)
        encoder = torch.nn.Linear(6, 8)
        inputs = torch.randn(members, 8, 6)  # 8 examples
        scores = torch.tensor([0.0, 3.0, 0.8, 1.6, 2.0, 4.6, 5.0, 3.0]) if kind == "pairs" else None
        if world > 1:
            inputs = inputs[:, rank * 4 : (rank + 1) * 4]
            scores = None if scores is None else scores[rank * 4 : (rank + 1) * 4]
        loss, grad = loss_and_grad(encoder, inputs, scores)
        if world > 1:
            dist.all_reduce(grad)
            grad /= world  # what DDP does
        results[kind] = {"loss": loss, "grad": grad}
    torch.save(results, f"{out}.{rank}")


if __name__ == "__main__":
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    main(rank, world, port, out)
    if world > 1:
        dist.destroy_process_group()
