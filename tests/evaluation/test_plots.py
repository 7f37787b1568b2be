"""Result charts: bars for a few rows, an annotated heatmap for many; both readable sizes, written atomically."""

import matplotlib.image

from promptemb.evaluation.plots import MAX_BAR_ROWS, plot_curve, plot_scores

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg"]


def scores(rows: int) -> dict:
    return {f"pooler{r}": {task: 50.0 + r + t for t, task in enumerate(TASKS)} for r in range(rows)}


def test_few_rows_are_bars_many_rows_a_heatmap_of_readable_size(tmp_path):
    for rows in (1, MAX_BAR_ROWS, 22):
        path = plot_scores(scores(rows), tmp_path / f"r{rows}.png", "title")
        height, width, _ = matplotlib.image.imread(path).shape
        assert 600 <= width <= 1600 and 300 <= height <= 1400, (rows, width, height)
    assert not list(tmp_path.glob("*.tmp*"))


def test_curve_png_is_written(tmp_path):
    points = [{"step": s, "mask": 40.0 + s, "avg": 80.0, "seconds": 1.0} for s in (0, 25, 50)]
    path = plot_curve(points, tmp_path / "curve.png", "dev")
    assert matplotlib.image.imread(path).shape[1] > 500
