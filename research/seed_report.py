"""Multi-seed report: every score of several runs that differ only in their seed, as mean ± std, min and max per
task family, pooler and task, with each seed's own row kept.

    python -m promptemb.research.seed_report RUN_OR_SWEEP_DIR [...] [--output-dir DIR]

A path is a run folder holding results.json (from train.py or evaluate.py) or a folder whose sub-folders are such
runs (a `train.py -m ... seed=0,1,2` sweep folder). `train.py -m` writes this report into its sweep folder by itself
when `seed` is the only swept key. The runs must agree on everything but the seed (the resolved config when the runs
recorded one, else model, input form, poolers and tasks); two runs with the same seed, or runs scoring different
poolers or tasks, are a one-line error. std is the sample standard deviation (ddof = 1, as papers' "mean ± std" over
seeds); it is null for a single run. Writes seed_report.json (strict JSON, atomic, with every run's provenance),
seed_report.md and seed_report.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from promptemb.common.errors import ConfigError, DataError, UserError, exit_on_user_error
from promptemb.common.io import atomic_write_json, atomic_write_text
from promptemb.evaluation.plots import TASK_ABBREVIATIONS
from promptemb.evaluation.report import FAMILY_REPORT, software_versions, utc_timestamp
from promptemb.research.plots import plot_seed_spread

log = logging.getLogger(__name__)
RESULTS_FILE = "results.json"
CURVE_FILE = "curve.json"
#: config keys that may differ between the seeds of one report: where the run writes, how it was started, and the
#: recipe's pinned results (a note about the recipe, not a setting of the run)
RUN_ONLY_KEYS = ("seed", "output_dir", "ckpt_path", "resume", "export_dir", "expected_scores")


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run folders (holding results.json) named directly or as the sub-folders of a sweep folder."""
    runs: list[Path] = []
    for path in map(Path, paths):
        if (path / RESULTS_FILE).is_file():
            runs.append(path)
        elif path.is_dir():
            found = sorted((d for d in path.iterdir() if (d / RESULTS_FILE).is_file()),
                           key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))
            if not found:
                raise DataError(f"{path} holds no {RESULTS_FILE} and no run folder with one; pass run folders of "
                                "finished runs (train.py or evaluate.py output_dir)")
            runs.extend(found)
        else:
            raise DataError(f"{path} does not exist; pass run folders or a sweep folder")
    if not runs:
        raise ConfigError("no run folders given; pass at least one run or sweep folder")
    return runs


def read_run(run_dir: Path) -> dict:
    """One seed's scores: {"seed", "run_dir", "families": {family: {"scores", "pearson"}}, "dev", "provenance"}."""
    try:
        result = json.loads((run_dir / RESULTS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"{run_dir / RESULTS_FILE} cannot be read ({err}); re-run that seed") from None
    prov = result.get("provenance") or {}
    if prov.get("seed") is None:
        raise DataError(f"{run_dir / RESULTS_FILE} records no seed; it was not written by train.py or evaluate.py")
    families = result.get("families") or {"sts": {"scores": result["scores"], "pearson": result.get("pearson")}}
    dev = {}
    best_dev = (prov.get("model") or {}).get("best_dev")
    if best_dev is not None:
        dev["best_dev"] = {"value": best_dev, "metric": prov["model"].get("selected_on")}
    curve_path = run_dir / CURVE_FILE
    if curve_path.is_file():
        dev["curve"] = json.loads(curve_path.read_text(encoding="utf-8"))
    return {"seed": int(prov["seed"]), "run_dir": str(run_dir),
            "families": {family: {"scores": block["scores"], "pearson": block.get("pearson")}
                         for family, block in families.items()},
            "dev": dev, "provenance": prov}


def comparable_setup(run: dict) -> dict:
    """What must be equal across the seeds of one report: the resolved config without its run-only keys when the run
    recorded one (train.py), else the model, input form, poolers and tasks (evaluate.py)."""
    prov = run["provenance"]
    if isinstance(prov.get("config"), dict):
        return {key: value for key, value in prov["config"].items() if key not in RUN_ONLY_KEYS}
    return {"model": (prov.get("model") or {}).get("name_or_path"), "input": prov.get("input"),
            "poolers": sorted(prov.get("poolers") or {}), "tasks": sorted(prov.get("tasks") or {}),
            "post_processing": sorted(prov.get("post_processing") or {})}


def run_identity(run: dict) -> tuple[int, str]:
    """(seed, output folder): values a resolved config repeats elsewhere (`data.seed: ${seed}`, checkpoint folders
    under `${output_dir}`), which may differ between seeds."""
    config = run["provenance"].get("config") or {}
    return run["seed"], str(config.get("output_dir") or run["run_dir"])


def first_difference(a, b, ids_a: tuple[int, str], ids_b: tuple[int, str], prefix: str = "") -> str | None:
    """The dotted key of the first difference between two nested records (None when equal); a value that is each
    run's own seed, or a path inside each run's own output folder, is not a difference."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{prefix}.{key}" if prefix else str(key)
            if key not in a or key not in b:
                return where
            found = first_difference(a[key], b[key], ids_a, ids_b, where)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, ids_a, ids_b, f"{prefix}[{index}]")
            if found:
                return found
        return None
    if a == b:
        return None
    if isinstance(a, int) and isinstance(b, int) and (a, b) == (ids_a[0], ids_b[0]):
        return None
    if isinstance(a, str) and isinstance(b, str) and a.startswith(ids_a[1]) and b.startswith(ids_b[1]) \
            and a[len(ids_a[1]):] == b[len(ids_b[1]):]:
        return None
    return prefix or "<value>"


def check_same_setup(runs: list[dict]) -> None:
    seeds = [run["seed"] for run in runs]
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        dirs = [run["run_dir"] for run in runs if run["seed"] in repeated]
        raise ConfigError(f"seed {repeated[0]} appears in more than one run ({', '.join(dirs)}); pass each seed once")
    reference = comparable_setup(runs[0])
    for run in runs[1:]:
        key = first_difference(reference, comparable_setup(run), run_identity(runs[0]), run_identity(run))
        if key:
            raise ConfigError(f"runs {runs[0]['run_dir']} and {run['run_dir']} differ in {key!r}, not only in the "
                              "seed; a seed report aggregates runs of one setup")


def spread(values: list[float]) -> dict:
    """mean, sample std (ddof = 1; null for one value), min, max and n of one score over seeds."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


def aggregate_table(tables: list[dict[str, dict[str, float]]], where: str) -> dict[str, dict[str, dict]]:
    """{row: {task: spread}} over the seeds' {row: {task: score}} tables, which must have the same rows and tasks."""
    first = tables[0]
    for table in tables[1:]:
        if {row: list(cells) for row, cells in table.items()} != {row: list(cells) for row, cells in first.items()}:
            raise ConfigError(f"the runs score different poolers or tasks in {where}; a seed report needs the same "
                              "rows and tasks in every run")
    return {row: {task: spread([table[row][task] for table in tables]) for task in cells}
            for row, cells in first.items()}


def aggregate_curves(curves: list[dict]) -> list[dict]:
    """Per dev-evaluation step, each pooler's dev score as a spread over the seeds that evaluated that step."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for curve in curves:
        for point in curve.get("points", []):
            for key, value in point.items():
                if key not in ("step", "seconds") and value is not None:
                    by_step.setdefault(int(point["step"]), {}).setdefault(key, []).append(float(value))
    return [{"step": step, **{pooler: spread(values) for pooler, values in poolers.items()}}
            for step, poolers in sorted(by_step.items())]


def build_report(runs: list[dict]) -> dict:
    check_same_setup(runs)
    runs = sorted(runs, key=lambda run: run["seed"])
    families = {}
    for family in runs[0]["families"]:
        if any(family not in run["families"] for run in runs):
            raise ConfigError(f"not every run scored the {family} tasks; a seed report needs the same tasks in every "
                              "run")
        block = {"scores": aggregate_table([run["families"][family]["scores"] for run in runs], family)}
        pearson = [run["families"][family].get("pearson") for run in runs]
        if all(pearson):
            block["pearson"] = aggregate_table(pearson, f"{family} (Pearson)")
        families[family] = block
    dev = {}
    best = [run["dev"]["best_dev"]["value"] for run in runs if "best_dev" in run["dev"]]
    if len(best) == len(runs):
        dev["best_dev"] = {"metric": runs[0]["dev"]["best_dev"]["metric"], **spread(best)}
    curves = [run["dev"]["curve"] for run in runs if "curve" in run["dev"]]
    if curves:
        dev["curve"] = aggregate_curves(curves)
    prov = runs[0]["provenance"]
    return {
        "seeds": [run["seed"] for run in runs],
        "families": families,
        "dev": dev,
        "per_seed": [{"seed": run["seed"], "run_dir": run["run_dir"], "families": run["families"],
                      "best_dev": run["dev"].get("best_dev", {}).get("value")} for run in runs],
        "provenance": {
            "std": "sample standard deviation over seeds (ddof = 1)",
            "model": (prov.get("model") or {}).get("name_or_path"),
            "input": prov.get("input"),
            "runs": {run["run_dir"]: run["provenance"] for run in runs},
            "versions": software_versions(),
            "timestamp": utc_timestamp(),
        },
    }


def cell(stats: dict) -> str:
    return f"{stats['mean']:.2f} ± {stats['std']:.2f}" if stats["std"] is not None else f"{stats['mean']:.2f}"


def spread_markdown(table: dict[str, dict[str, dict]], fmt) -> str:
    tasks = list(next(iter(table.values())))
    header = ["pooler", *(TASK_ABBREVIATIONS.get(t, t) for t in tasks)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * len(tasks)) + "|"]
    lines += ["| " + " | ".join([row, *(fmt(cells[t]) for t in tasks)]) + " |" for row, cells in table.items()]
    return "\n".join(lines) + "\n"


def report_markdown(report: dict) -> str:
    seeds = report["seeds"]
    prov = report["provenance"]
    text = (f"# Seed report: {len(seeds)} seeds ({', '.join(map(str, seeds))})\n\n"
            f"model: `{prov['model']}`  \ntemplate: `{(prov.get('input') or {}).get('template')}`  \n"
            f"cells: mean ± std over seeds ({prov['std']}); per-seed scores and every run's provenance in "
            "seed_report.json\n\n")
    if report["dev"].get("best_dev"):
        best = report["dev"]["best_dev"]
        text += (f"selection score ({best['metric']}, best checkpoint): {cell(best)} "
                 f"(min {best['min']:.2f}, max {best['max']:.2f})\n\n")
    for family, block in report["families"].items():
        heading, protocol, _ = FAMILY_REPORT.get(family, (family, "", ""))
        text += f"## {heading}\n\nprotocol: {protocol}\n\n" + spread_markdown(block["scores"], cell) + "\n"
        text += "min / max over seeds:\n\n" + spread_markdown(
            block["scores"], lambda s: f"{s['min']:.2f} / {s['max']:.2f}") + "\n"
        if block.get("pearson"):
            text += "Pearson x100, mean ± std:\n\n" + spread_markdown(block["pearson"], cell) + "\n"
        tasks = list(next(iter(block["scores"].values())))
        header = ["seed", "pooler", *(TASK_ABBREVIATIONS.get(t, t) for t in tasks)]
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---:", "---"] + ["---:"] * len(tasks)) + "|"]
        for run in report["per_seed"]:
            for row, cells in run["families"][family]["scores"].items():
                lines.append("| " + " | ".join([str(run["seed"]), row, *(f"{cells[t]:.2f}" for t in tasks)]) + " |")
        text += "per seed:\n\n" + "\n".join(lines) + "\n\n"
    return text


def write_report(report: dict, output_dir: Path) -> list[Path]:
    output_dir = Path(output_dir)
    written = [atomic_write_json(output_dir / "seed_report.json", report),
               atomic_write_text(output_dir / "seed_report.md", report_markdown(report))]
    family, block = next(iter(report["families"].items()))
    per_seed = {run["seed"]: run["families"][family]["scores"] for run in report["per_seed"]}
    axis = FAMILY_REPORT.get(family, ("", "", "score"))[2]
    written.append(plot_seed_spread(block["scores"], per_seed, report["dev"].get("curve"),
                                    output_dir / "seed_report.png",
                                    f"{report['provenance']['model']}: mean ± std over seeds "
                                    f"{', '.join(map(str, report['seeds']))}", axis))
    return written


def seed_report(paths: list[str | Path], output_dir: str | Path) -> tuple[dict, list[Path]]:
    report = build_report([read_run(run) for run in find_runs(paths)])
    return report, write_report(report, Path(output_dir))


def summary_line(report: dict) -> str:
    family, block = next(iter(report["families"].items()))
    parts = [f"{row} avg {cell(cells['avg'])}" for row, cells in block["scores"].items() if "avg" in cells]
    return f"{len(report['seeds'])} seeds {report['seeds']}, {family}: " + "; ".join(parts)


class SeedReportCallback(Callback):
    """Hydra callback (configs/train.yaml `hydra.callbacks`, before the sweep's table): a `train.py -m` sweep over
    `seed` alone writes this report into its sweep folder, over its completed trials (a failed seed is left out and
    the report says how many seeds it has)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from promptemb.common.overrides import parse_overrides
        from promptemb.training.trials import COMPLETED, sweep_rows

        try:
            swept = sorted(o.get_key_element().lstrip("+~") for o in parse_overrides(list(config.hydra.overrides.task))
                           if o.is_sweep_override())
        except Exception:  # a syntax error: Hydra has reported it already
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = [row["run_dir"] for row in sweep_rows(sweep_dir) if row["status"] == COMPLETED and row.get("run_dir")]
        if swept != ["seed"] or not runs:
            return
        try:
            report, written = seed_report(runs, sweep_dir)
        except UserError as err:
            log.error("no seed report: %s", str(err).splitlines()[0])
            return
        print(f"seed report: {summary_line(report)}\nwrote {', '.join(map(str, written))}", flush=True)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="run folders (with results.json) or a sweep folder of them")
    parser.add_argument("--output-dir", default=None, help="default: the single folder given, else ./seed_report")
    args = parser.parse_args(argv)
    output_dir = args.output_dir or (args.paths[0] if len(args.paths) == 1 else "seed_report")
    report, written = seed_report(args.paths, output_dir)
    print(summary_line(report))
    print("wrote " + ", ".join(str(path) for path in written))


if __name__ == "__main__":
    main()
