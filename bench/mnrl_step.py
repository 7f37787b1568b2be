"""sentence-transformers' training step with `MultipleNegativesRankingLoss`, the baseline for a recipe's step.

    python bench/mnrl_step.py --model model:all-mpnet-base-v2 [--batch-size 32] [--max-seq-length 34] \
        [--steps 5] [--warmup 2] [--lr 3e-5] [--out result.json]

The unsupervised SimCSE form of MNRL (anchor = positive = the same sentence, dropout as the noise, in-batch negatives,
scale 20 = 1/0.05) on the model's own SentenceTransformer pipeline (all-mpnet-base-v2: mean pooling, normalize), the
first `--batch-size` x (warmup + steps) lines of the local Wikipedia sample (the quickstart recipes' corpus),
`--max-seq-length` 34 = the recipes' 32 sentence tokens + `<s>` `</s>`; AdamW. One step = tokenize, forward of both
columns, loss, backward, optimiser step, zero_grad, as `SentenceTransformerTrainer` runs it (no data loader, no
logging). Reports wall and process CPU seconds per step (all threads: the steadier figure on a shared CPU) and
padded tokens per step. Compare with `bench/train_throughput.py experiment=quickstart_unsup_mpnet --mode loop`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from sentence_transformers import SentenceTransformer, losses

from promptemb.data.root import resolve_data_root
from promptemb.encoder.loading import resolve_model_path

WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="model:all-mpnet-base-v2")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=34)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    root = resolve_data_root(args.data_root or os.environ.get("PROMPTEMB_DATA"))
    lines = [line.strip() for line in (root / WIKI_SAMPLE).read_text(encoding="utf-8").splitlines() if line.strip()]
    model = SentenceTransformer(str(resolve_model_path(args.model)), device="cpu")
    model.max_seq_length = args.max_seq_length
    model.train()
    loss_fn = losses.MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    walls, cpus, tokens = [], [], []
    for step in range(args.warmup + args.steps):
        batch = lines[step * args.batch_size:(step + 1) * args.batch_size]
        wall, cpu = time.perf_counter(), time.process_time()
        features = [model.tokenize(batch), model.tokenize(batch)]
        loss = loss_fn(features, None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            tokens.append(sum(int(f["input_ids"].numel()) for f in features))
    result = {"model": args.model, "batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
              "steps": args.steps, "warmup": args.warmup, "threads": torch.get_num_threads(),
              "step_wall_s_mean": statistics.mean(walls), "step_wall_s_min": min(walls),
              "step_cpu_s_mean": statistics.mean(cpus), "padded_tokens_per_step": statistics.mean(tokens),
              "sentences_per_s": args.batch_size / statistics.mean(walls), "last_loss": float(loss)}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
