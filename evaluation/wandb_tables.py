"""STS result tables for W&B: one `wandb.Table` (row = pooler/variant, columns = tasks + avg) per result.

`log_sts_tables(trainer.loggers, result, ...)` is a no-op without a WandbLogger, so callers need no W&B checks.
`result` has the shape of evaluate_sts / results.json: {"scores": {label: {task: float, ..., "avg": float}}}.
"""

from __future__ import annotations

from pathlib import Path

from promptemb.common.optional import require


def sts_table_rows(result: dict) -> tuple[list[str], list[list]]:
    """(columns, rows): "variant", every task in first-seen order, "avg" last."""
    scores = result["scores"]
    tasks: list[str] = []
    for row in scores.values():
        tasks += [task for task in row if task != "avg" and task not in tasks]
    columns = ["variant", *tasks, "avg"]
    rows = [[label, *(row.get(task) for task in tasks), row.get("avg")] for label, row in scores.items()]
    return columns, rows


def log_sts_tables(loggers, result: dict, key: str = "final/sts", step: int | None = None,
                   image_path: str | Path | None = None) -> int:
    """Log `result` as a W&B table under `key` (plus `key/<variant>/<task>` scalars and the results PNG as
    `key_plot`) to every WandbLogger in `loggers`; returns how many runs received it."""
    from pytorch_lightning.loggers import WandbLogger

    targets = [logger for logger in loggers or () if isinstance(logger, WandbLogger)]
    if not targets:
        return 0
    wandb = require("wandb", "logging tables to W&B")

    columns, rows = sts_table_rows(result)
    scalars = {f"{key}/{row[0]}/{task}": value for row in rows for task, value in zip(columns[1:], row[1:])
               if value is not None}
    for logger in targets:
        payload = {key: wandb.Table(columns=columns, data=rows), **scalars}
        if image_path and Path(image_path).is_file():
            payload[f"{key}_plot"] = wandb.Image(str(image_path))
        if step is not None:
            payload["trainer/global_step"] = step
        logger.experiment.log(payload)
    return len(targets)
