"""Run by test_matryoshka_2d.py in separate processes: the 2D loss (InfoNCE over widths at two depths and the KL
term between them) over 2 gloo ranks vs one process on the joined batch."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.lightning_modules.losses import world_size
from promptemb.lightning_modules.matryoshka import AdaptiveLayers, LayerPlan, Matryoshka


def make_problem():
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(6, 4, dtype=torch.float64), torch.nn.Tanh(),
                                 torch.nn.Linear(4, 4, dtype=torch.float64))
    inputs = torch.randn(3, 8, 6, dtype=torch.float64)  # anchors, positives, hard negatives of 8 examples
    return layers, inputs


def loss_and_grad(layers, inputs):
    """Views at the last depth (the whole stack) and at depth 1 (its first layer), Matryoshka2dLoss-style."""
    views = [tuple(layers(x) for x in inputs), tuple(layers[0](x) for x in inputs)]
    adaptive = AdaptiveLayers.build({"kl_div_weight": 2.0}, 2)
    plan = LayerPlan(2, (1,), ((0, 1), (1,)))
    matryoshka = Matryoshka.build([4, 2])
    loss = adaptive.loss(plan, views, lambda v, widths: matryoshka.subset(widths).loss(*v, 0.05), lambda v: v)
    (loss * world_size()).backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in layers.parameters()])


def main(rank: int, world: int, port: int, out: str) -> None:
    layers, inputs = make_problem()
    if world == 1:
        loss, grad = loss_and_grad(layers, inputs)
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        loss, grad = loss_and_grad(layers, inputs[:, rank * 4 : (rank + 1) * 4])
        dist.all_reduce(grad)
        grad /= world  # what DDP does
        dist.destroy_process_group()
    torch.save({"loss": loss, "grad": grad}, f"{out}.{rank}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
