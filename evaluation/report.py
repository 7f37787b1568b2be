"""results.json (scores + provenance) and a markdown table, both written atomically."""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

from promptemb.common.io import atomic_write_json, atomic_write_text
from promptemb.common.version import framework_version
from promptemb.evaluation.families import FAMILIES
from promptemb.evaluation.plots import TASK_ABBREVIATIONS, plot_scores


def software_versions() -> dict[str, str]:
    import numpy
    import scipy
    import torch
    import transformers

    return {
        "promptemb": framework_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
    }


def utc_timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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


def layers_by_widths(scores: dict[str, dict[str, float]], layers, dims) -> str:
    """The 2D Matryoshka table of each pooler scored at `layers` (evaluate.py layers=[...]): its task average on the
    whole model and cut after each layer (rows, deepest first), at its full width and each of `dims` (columns,
    widest first); one table per pooler."""
    depths = sorted(layers, reverse=True)
    tables = ""
    for pooler in (label for label in scores if f"{label}@{depths[0]}" in scores):
        widths = [d for d in sorted(dims, reverse=True) if f"{pooler}@{d}" in scores]
        header = ["layers", "full width", *(str(d) for d in widths)]
        lines = [f"{pooler}, average over the tasks:\n", "| " + " | ".join(header) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        for name, row in [("all", pooler), *((f"1..{d}" if d else "0 (embeddings)", f"{pooler}@{d}") for d in depths)]:
            cells = [scores.get(label, {}).get("avg") for label in (row, *(f"{row}@{d}" for d in widths))]
            lines.append("| " + " | ".join([name, *("-" if v is None else f"{v:.2f}" for v in cells)]) + " |")
        tables += "\n".join(lines) + "\n\n"
    return tables


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


class FamilyWording(Mapping[str, tuple[str, str, str]]):
    """Per registered evaluation family: its markdown heading, protocol line and the PNG's y-axis label (the family
    class's `title`, `summary` and `axis_label`)."""

    def __getitem__(self, family: str) -> tuple[str, str, str]:
        cls = FAMILIES[family]
        return (cls.title or family, cls.summary or f"{cls.primary_metric} of each task",
                cls.axis_label or f"{cls.primary_metric} x100")

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


FAMILY_REPORT = FamilyWording()


def plot_name(family: str) -> str:
    """results.png for STS (as before), results_<family>.png for the other families."""
    return "results.png" if family == "sts" else f"results_{family}.png"


def write_report(output_dir: Path, results: dict) -> tuple[Path, Path]:
    """Write results.json, results.md (one table per task family) and one PNG per family; return the JSON and
    markdown paths."""
    output_dir = Path(output_dir)
    json_path = atomic_write_json(output_dir / "results.json", results)
    prov = results["provenance"]
    families = results.get("families") or {"sts": {"scores": results["scores"]}}
    title = " + ".join(FAMILY_REPORT[family][0] for family in families)
    header = (
        f"# {title} results\n\nmodel: `{prov['model']['name_or_path']}`  \n"
        f"template: `{prov['input']['template']}` (sentence rule: {prov['input']['sentence_rule']})  \n"
        f"post-processing: {post_summary(prov)}  \n"
        f"seed {prov['seed']}\n\n"
    )
    body = ""
    template = prov["input"]["template"] or "no template"
    for family, family_result in families.items():
        heading, protocol, axis = FAMILY_REPORT[family]
        timing = family_result.get("timing") or {}
        seconds = "; ".join(f"{key.removesuffix('_s')} {value:.1f} s" for key, value in timing.items())
        wall = f"  \nwall time: {seconds}" if seconds else ""
        body += f"## {heading}\n\nprotocol: {protocol}{wall}\n\n"
        body += markdown_table(family_result["scores"]) + "\n"
        if prov.get("layers"):
            body += layers_by_widths(family_result["scores"], prov["layers"], prov.get("dims") or ())
        if family_result.get("pearson"):
            body += "Pearson x100 (cosine), same rows:\n\n" + markdown_table(family_result["pearson"]) + "\n"
        plot_scores(family_result["scores"], output_dir / plot_name(family),
                    f"{prov['model']['name_or_path']} | {template} | {heading}", axis_label=axis)
    if results.get("analysis"):
        body += analysis_table(results["analysis"])
    md_path = atomic_write_text(output_dir / "results.md", header + body)
    return json_path, md_path
