"""PNG charts of the research drivers (matplotlib, Agg backend, written atomically)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from promptemb.common.io import atomic_write
from promptemb.evaluation.plots import TASK_ABBREVIATIONS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return path


def plot_layer_curve(curves: dict[str, list[tuple[int, float]]], combos: dict[str, float], path: Path,
                     title: str) -> Path:
    """Score per single layer, one line per pooler; layer combinations as dashed horizontal lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for pooler, points in curves.items():
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{pooler} (single layer)")
    for i, (label, value) in enumerate(combos.items()):
        ax.axhline(value, linestyle="--", linewidth=1, color=f"C{len(curves) + i}", label=f"{label}: {value:.2f}")
    ax.set_xlabel("hidden-state layer (0 = embedding output)")
    ax.set_ylabel("score (average over tasks)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_pair_heatmap(grid: np.ndarray, path: Path, title: str) -> Path:
    """Upper-triangular heatmap: cell (i, j) = score of the average of layers i and j (diagonal: layer i alone)."""
    plt = _pyplot()
    size = grid.shape[0]
    fig, ax = plt.subplots(figsize=(1.6 + 0.7 * size, 1.2 + 0.6 * size))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis")
    best = np.unravel_index(np.nanargmax(grid), grid.shape)
    for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=7,
                    color="red" if (i, j) == best else ("white" if image.norm(value) < 0.6 else "black"))
    ax.set_xticks(range(size))
    ax.set_yticks(range(size))
    ax.set_xlabel("layer j")
    ax.set_ylabel("layer i")
    ax.set_title(title, fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.046)
    return _save(fig, path)


def plot_ranked_bars(labels: Sequence[str], values: Sequence[float], path: Path, title: str, xlabel: str) -> Path:
    """Horizontal bars, best on top (the template search's ranking)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 1.0 + 0.32 * len(labels)))
    ys = np.arange(len(labels))[::-1]
    bars = ax.barh(ys, values, color=["C3"] + ["C0"] * (len(labels) - 1))
    ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_title(title.replace(": ", ":\n", 1), fontsize=9)  # two lines: long titles would be cut at the right
    ax.set_xlim(min(0.0, *values), max(values) * 1.12 if max(values) > 0 else 1.0)
    return _save(fig, path)


def plot_seed_spread(table: dict[str, dict[str, dict]], per_seed: dict[int, dict[str, dict[str, float]]],
                     curve: list[dict] | None, path: Path, title: str, axis_label: str) -> Path:
    """Left: per task, one bar per pooler at the mean over seeds, error bar = std, each seed's score as a dot.
    Right (when there is a dev curve): each pooler's mean dev score per step, shaded between min and max."""
    plt = _pyplot()
    tasks = list(next(iter(table.values())))
    panels = 2 if curve else 1
    fig, axes = plt.subplots(1, panels, figsize=(max(6.0, 1.2 * len(tasks)) + 4.0 * (panels - 1), 4.2),
                             gridspec_kw={"width_ratios": [max(6.0, 1.2 * len(tasks)), 4.0][:panels]})
    ax = axes[0] if panels == 2 else axes
    width = 0.8 / len(table)
    for i, (pooler, cells) in enumerate(table.items()):
        xs = np.arange(len(tasks)) + (i - (len(table) - 1) / 2) * width
        means = [cells[t]["mean"] for t in tasks]
        stds = [cells[t]["std"] or 0.0 for t in tasks]
        bars = ax.bar(xs, means, width, yerr=stds, capsize=2, label=pooler, color=f"C{i}", alpha=0.8)
        ax.bar_label(bars, fmt="%.1f", fontsize=6, padding=2)
        for scores in per_seed.values():
            ax.plot(xs, [scores[pooler][t] for t in tasks], "k.", markersize=3)
    ax.set_xticks(range(len(tasks)), [TASK_ABBREVIATIONS.get(t, t) for t in tasks], fontsize=8)
    values = [s[p][t] for s in per_seed.values() for p in table for t in tasks]
    ax.set_ylim(max(0.0, min(values) - 10), min(100.0, max(values) + 8))
    ax.set_ylabel(axis_label)
    ax.legend(fontsize=7, ncol=len(table), loc="upper left")
    ax.set_title(f"test tasks (dots: the {len(per_seed)} seeds)", fontsize=9)
    if curve:
        dev = axes[1]
        steps = [point["step"] for point in curve]
        poolers = [key for key in curve[0] if key != "step"]
        for i, pooler in enumerate(poolers):
            points = [p for p in curve if pooler in p]
            xs = [p["step"] for p in points]
            dev.plot(xs, [p[pooler]["mean"] for p in points], marker="o", markersize=3, color=f"C{i}", label=pooler)
            dev.fill_between(xs, [p[pooler]["min"] for p in points], [p[pooler]["max"] for p in points],
                             color=f"C{i}", alpha=0.2)
        dev.set_xticks(steps)
        dev.set_xlabel("optimiser step")
        dev.set_ylabel("dev Spearman x100")
        dev.set_title("dev curve: mean, shaded min..max", fontsize=9)
        dev.grid(alpha=0.3)
        dev.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)
