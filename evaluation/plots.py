"""PNG charts of results: grouped bars, one group per task, one bar per pooler."""

from __future__ import annotations

from pathlib import Path

from common.io import atomic_write

TASK_ABBREVIATIONS = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}


def plot_scores(scores: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(next(iter(scores.values())))
    width = 0.8 / len(scores)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(tasks) * max(1, len(scores) / 2)), 4.0))
    for i, (pooler, row) in enumerate(scores.items()):
        xs = [t + (i - (len(scores) - 1) / 2) * width for t in range(len(tasks))]
        bars = ax.bar(xs, [row[task] for task in tasks], width, label=pooler)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    ax.set_xticks(range(len(tasks)), [TASK_ABBREVIATIONS.get(t, t) for t in tasks])
    ax.set_ylabel("Spearman x100 (cosine)")
    ax.set_ylim(min(0.0, *(v for row in scores.values() for v in row.values())), 100)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, ncol=min(len(scores), 4), loc="upper left")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return path


def plot_curve(points: list[dict], path: Path, title: str) -> Path:
    """One line per pooler: score vs optimiser step (`points` = [{"step": s, pooler: value, ...}, ...])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    poolers = [key for key in points[0] if key not in ("step", "seconds")]
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    steps = [p["step"] for p in points]
    for pooler in poolers:
        ax.plot(steps, [p[pooler] for p in points], marker="o", markersize=3, label=pooler)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("Spearman x100")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return path
