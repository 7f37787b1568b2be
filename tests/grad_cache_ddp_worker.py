"""Run by test_grad_cache.py in separate processes: a gradient-cached PromptBERT step under real DDP (2 gloo ranks,
4 sentences each) vs the ordinary step of one process on the joined 8 sentences."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.lightning_modules.losses import world_size
from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup
from tests.lightning_modules.test_grad_cache import SENTENCES, TRIPLETS


class TrainingStep(torch.nn.Module):
    """What Lightning's DDP wrapper does: the training step runs inside DDP's forward, the loss it returns is
    back-propagated once, and DDP all-reduces (averages) the gradients during that backward."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, batch):
        loss, _, to_backward = self.module.contrastive_loss(batch)
        return loss.detach(), to_backward(loss * world_size())


def main(kind: str, rank: int, world: int, port: int, chunk: int, out: str) -> None:
    torch.manual_seed(0)
    cls, batch = (PromptBERTUnsup, SENTENCES) if kind == "unsup" else (PromptBERTSup, TRIPLETS[:4])
    module = cls(os.environ["TINY_BERT"], grad_cache_chunk_size=chunk or None).double().train()
    step = TrainingStep(module)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        local = len(batch) // world
        batch = batch[rank * local : (rank + 1) * local]
        step = torch.nn.parallel.DistributedDataParallel(step)
    loss, to_backward = step(batch)
    to_backward.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
    if world > 1:
        dist.destroy_process_group()
    torch.save({"loss": loss, "grads": grads}, f"{out}.{rank}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:6]), sys.argv[6])
