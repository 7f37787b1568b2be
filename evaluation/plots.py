"""PNG charts of results: per-task scores of each pooler (bars, or a heatmap for many rows) and dev curves."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

from promptemb.common.io import atomic_write
from promptemb.common.optional import available, install_hint

log = logging.getLogger(__name__)

TASK_ABBREVIATIONS = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "googlenews-TS": "GN-TS",
                      "googlenews-T": "GN-T", "googlenews-S": "GN-S", "searchsnippets": "snippets",
                      "stackoverflow": "stackov."}


MAX_BAR_ROWS = 4
_warned = False


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (PNG charts are skipped, with one warning per process) when
    the optional matplotlib is not installed."""
    global _warned
    if not available("matplotlib"):
        if not _warned:
            log.warning("matplotlib is not installed: PNG charts are skipped; %s", install_hint("matplotlib"))
            _warned = True
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scores(scores: dict[str, dict[str, float]], path: Path, title: str,
                axis_label: str = "Spearman x100 (cosine)") -> Path | None:
    """Grouped bars (one group per task, one bar per row) for up to 4 rows; beyond that an annotated heatmap
    (rows x tasks), which stays readable for the 20-odd rows of a poolers x post-processors run."""
    plt = pyplot()
    if plt is None:
        return None

    tasks = list(next(iter(scores.values())))
    labels = [TASK_ABBREVIATIONS.get(t, t) for t in tasks]
    # constrained layout keeps the wrapped title and the legend below the axes inside the figure
    if len(scores) <= MAX_BAR_ROWS:
        width = 0.8 / len(scores)
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(tasks)), 4.4), layout="constrained")
        for i, (pooler, row) in enumerate(scores.items()):
            xs = [t + (i - (len(scores) - 1) / 2) * width for t in range(len(tasks))]
            bars = ax.bar(xs, [row[task] for task in tasks], width, label=pooler)
            ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1, rotation=90 if len(scores) > 2 else 0)
        ax.set_xticks(range(len(tasks)), labels)
        ax.set_ylabel(axis_label)
        ax.set_ylim(min(0.0, *(v for row in scores.values() for v in row.values())), 110)
        ax.set_yticks(range(0, 101, 20))
        ax.legend(fontsize=8, ncol=len(scores), loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)
    else:
        values = [[row[task] for task in tasks] for row in scores.values()]
        fig, ax = plt.subplots(figsize=(2.5 + 0.9 * len(tasks), 1.2 + 0.32 * len(scores)), layout="constrained")
        image = ax.imshow(values, cmap="viridis", aspect="auto")
        for r, row in enumerate(values):
            for c, value in enumerate(row):
                ax.text(c, r, f"{value:.1f}", ha="center", va="center", fontsize=7,
                        color="white" if image.norm(value) < 0.6 else "black")
        ax.set_xticks(range(len(tasks)), labels)
        ax.set_yticks(range(len(scores)), list(scores), fontsize=8)
        ax.xaxis.tick_top()
        fig.colorbar(image, ax=ax, label=axis_label, fraction=0.04)
    characters_per_line = int(fig.get_figwidth() * 13)
    ax.set_title("\n".join(textwrap.wrap(title, characters_per_line, break_on_hyphens=False)), fontsize=9)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return path


def plot_curve(points: list[dict], path: Path, title: str) -> Path | None:
    """One line per pooler: score vs optimiser step (`points` = [{"step": s, pooler: value, ...}, ...])."""
    plt = pyplot()
    if plt is None:
        return None

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
