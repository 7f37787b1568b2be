"""PNG charts of the research drivers (matplotlib, Agg backend, written atomically)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from common.io import atomic_write


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
