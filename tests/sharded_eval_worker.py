"""Run by test_sharded_evaluation.py in separate processes: STS-B dev scored by one process, or by 2 gloo ranks each
encoding a share of the batches (`promptemb.encoder.model.Shard`)."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from promptemb.data.tasks import get_tasks
from promptemb.encoder.model import Encoder, Shard
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_poolers

SENTENCES = [f"sentence number {i} " + "word " * (i % 7) for i in range(23)]  # 23 rows, batches of 4: 6 batches


def main(rank: int, world: int, port: int, model: str, data_root: str, out: str) -> None:
    torch.set_num_threads(1)  # two processes on a shared CPU
    encoder = Encoder(model, batch_size=4, progress=False)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        encoder.shard = Shard(rank, world)
    poolers = build_poolers(["mask", "avg"], {})
    template = Template('This sentence : "[X]" means [MASK] .')
    embeddings = encoder.embed(SENTENCES, poolers, template)
    forwards = encoder.stats.forward_batches
    encoder.batch_size = 64
    result = evaluate_sts(encoder, get_tasks(["STSBenchmark-dev"]), Path(data_root), poolers, ScoringOptions(template))
    if world > 1:
        dist.destroy_process_group()
    torch.save({"embeddings": embeddings, "scores": result["scores"], "forwards": forwards}, f"{out}.{rank}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:7])
