"""results.json (scores + provenance) and a markdown table, both written atomically."""

from __future__ import annotations

import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from common.io import atomic_write_json, atomic_write_text
from evaluation.plots import TASK_ABBREVIATIONS, plot_scores


def software_versions() -> dict[str, str]:
    import numpy
    import scipy
    import torch
    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
    }
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
        versions["project_commit"] = commit
    except (OSError, subprocess.CalledProcessError):
        pass
    return versions


def utc_timestamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def scoring_provenance(encoder, template, sentence_rule: str, max_sentence_tokens: int | None, poolers,
                       versions: dict | None = None) -> dict:
    """What every score record carries, from evaluate.py and from the training callback alike: the model, the
    input form, each pooler, the device and the software versions (`versions` as taken when the run started)."""
    return {
        "model": encoder.describe(),
        "input": {
            "template": template.text if template else None,
            "sentence_rule": sentence_rule if template else "none",
            "max_sentence_tokens": max_sentence_tokens,
        },
        "poolers": {pooler.name: pooler.describe() for pooler in poolers},
        "post_processing": None,
        "batch_size": encoder.batch_size,
        "device": str(encoder.device),
        "versions": versions or software_versions(),
        "timestamp": utc_timestamp(),
    }


def attach_scoring_details(prov: dict, result: dict, fit_corpus: str) -> dict:
    """Move what `evaluate_sts` reports about HOW it scored (each pooler's plan and fit corpus, the fitted
    post-processors, the fit corpora's sources, the tasks' files and checksums, the sentence count) out of `result`
    into the provenance record `prov`; the same for evaluate.py and the training callback."""
    prov["poolers"] = result.pop("poolers")
    prov["post_processing"] = result.pop("post_processing")
    prov["fit_corpus"] = fit_corpus
    prov["fit_corpora"] = result.pop("fit_corpora")
    prov["unique_sentences"] = result.pop("unique_sentences")
    prov["tasks"] = result.pop("tasks")
    return prov


def markdown_table(scores: dict[str, dict[str, float]]) -> str:
    """One row per pooler, one column per task (table order of the first pooler), then the average."""
    first = next(iter(scores.values()))
    tasks = [name for name in first if name != "avg"]
    header = ["pooler", *(TASK_ABBREVIATIONS.get(t, t) for t in tasks), "avg"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for pooler, row in scores.items():
        lines.append("| " + " | ".join([pooler, *(f"{row[t]:.2f}" for t in tasks), f"{row['avg']:.2f}"]) + " |")
    return "\n".join(lines) + "\n"


def post_summary(prov: dict) -> str:
    if not prov.get("post_processing"):
        return "none"
    return (f"rows `pooler+name(corpus)`, fitted on `{prov.get('fit_corpus')}` "
            "(T = each task's own sentences); see results.json provenance.post_processing")


ANALYSIS_METRICS = ("anisotropy", "alignment", "uniformity", "isoscore")


def analysis_table(analysis: dict[str, dict[str, dict]]) -> str:
    """Each geometry metric averaged over the tasks, one row per pooler/post-processor label."""
    header = ["row", *(f"{m} (task avg)" for m in ANALYSIS_METRICS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * len(ANALYSIS_METRICS)) + "|"]
    for label, per_task in analysis.items():
        cells = []
        for metric in ANALYSIS_METRICS:
            values = [m[metric] for m in per_task.values() if m[metric] is not None]
            cells.append(f"{sum(values) / len(values):.3f}" if values else "-")
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


def write_report(output_dir: Path, results: dict) -> tuple[Path, Path]:
    """Write results.json, results.md and results.png; return the JSON and markdown paths."""
    output_dir = Path(output_dir)
    json_path = atomic_write_json(output_dir / "results.json", results)
    prov = results["provenance"]
    header = (
        f"# STS results\n\nmodel: `{prov['model']['name_or_path']}`  \n"
        f"template: `{prov['input']['template']}` (sentence rule: {prov['input']['sentence_rule']})  \n"
        f"post-processing: {post_summary(prov)}  \n"
        f"protocol: cosine, Spearman x100, SentEval 'all' setting; seed {prov['seed']}\n\n"
    )
    body = markdown_table(results["scores"])
    if results.get("pearson"):
        body += "\nPearson x100 (cosine), same rows:\n\n" + markdown_table(results["pearson"])
    if results.get("analysis"):
        body += "\n" + analysis_table(results["analysis"])
    md_path = atomic_write_text(output_dir / "results.md", header + body)
    template = prov["input"]["template"] or "no template"
    plot_scores(results["scores"], output_dir / "results.png", f"{prov['model']['name_or_path']} | {template}")
    return json_path, md_path
