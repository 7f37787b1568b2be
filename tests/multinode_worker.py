"""Run by test_gpu_path.py: one "node" of a 2-node x 1-process Lightning DDP run simulated on localhost with gloo
(this process's NODE_RANK, MASTER_ADDR/PORT, WORLD_SIZE and LOCAL_RANK=0 in its environment, as SLURM or torchrun
would set them on each machine), or the single process on the joined batch (`single`). One optimiser step of
PromptBERT unsupervised on a tiny BERT (float64, no dropout); writes the loss and the gradients the optimiser saw."""

import os
import sys

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.lightning_modules.promptbert import PromptBERTUnsup
from tests.lightning_modules.test_grad_cache import SENTENCES


class RecordStep(pl.Callback):
    def __init__(self):
        self.grads = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:  # after DDP's all-reduce
        self.grads = {name: p.grad.detach().clone() for name, p in pl_module.named_parameters() if p.grad is not None}


def main(model_dir: str, mode: str, out: str) -> None:
    torch.manual_seed(0)
    module = PromptBERTUnsup(model_dir).double()
    record = RecordStep()
    nodes = 1 if mode == "single" else 2
    trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=nodes, strategy="ddp" if nodes > 1 else "auto",
                         max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False, callbacks=[record])
    node = int(os.environ.get("NODE_RANK", 0))
    batch = SENTENCES if nodes == 1 else SENTENCES[node * 4:(node + 1) * 4]  # each node its half of the batch
    torch.manual_seed(1)
    trainer.fit(module, DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
    assert trainer.world_size == nodes and trainer.node_rank == (node if nodes > 1 else 0)
    torch.save({"loss": trainer.callback_metrics["train/loss"], "grads": record.grads}, f"{out}.{node}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
