"""What every research driver writes: strict JSON (atomic), a markdown table, and the provenance record."""

from __future__ import annotations

from pathlib import Path

from promptemb.common.io import atomic_write_json, atomic_write_text
from promptemb.evaluation.report import software_versions, utc_timestamp


def provenance(encoder, group, **extra) -> dict:
    """Model, task family and files (with checksums), software versions and time, plus the driver's own fields."""
    return {
        "model": encoder.describe(),
        "task_family": group.family,
        "metric": group.metric,
        "tasks": {task.name: {"split": task.split, "pairs": task.pairs, "files": task.files()}
                  for task in group.tasks},
        **extra,
        "versions": software_versions(),
        "timestamp": utc_timestamp(),
    }


def markdown(header: list[str], rows: list[list]) -> str:
    """A markdown table; floats with 2 decimals, the first column left-aligned, the others right-aligned."""
    def cell(value) -> str:
        if value is None:  # a metric the family does not have (Pearson outside STS)
            return "-"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_outputs(output_dir: Path, stem: str, record: dict, title: str, table: str) -> tuple[Path, Path]:
    output_dir = Path(output_dir)
    json_path = atomic_write_json(output_dir / f"{stem}.json", record)
    md_path = atomic_write_text(output_dir / f"{stem}.md", f"# {title}\n\n{table}")
    return json_path, md_path


def announce(summary: str, written: list[Path]) -> None:
    """What every driver prints at the end: its one-line result, then the files it wrote."""
    print(summary)
    print("wrote " + ", ".join(str(path) for path in written))
