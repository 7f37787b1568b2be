"""Pinned results: compare a finished run with the `expected_scores` its experiment file records.

    python -m promptemb.research.expected_scores EXPERIMENT RUN_DIR

An experiment file pins what the recipe gives on a CPU (`expected_scores: {tolerance, scores: {name: value}}`);
score names are `best_dev` (the selected checkpoint's dev score) and `<family>/<pooler>/<task>` in the run's
results.json (`sts/mask/avg` = the 7-task average of [MASK] pooling). Prints one table of expected vs measured and
exits 1 when any score leaves its band (|measured - expected| > tolerance). `make reproduce` re-runs every recipe
that pins scores and checks them this way (tests/research/test_reproduce.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from promptemb.common.errors import ConfigError, DataError, exit_on_user_error

EXPERIMENTS = Path(__file__).resolve().parents[1] / "configs" / "experiment"


def experiment_names() -> list[str]:
    return sorted(path.stem for path in EXPERIMENTS.glob("*.yaml"))


def pinned(experiment: str) -> dict | None:
    """The experiment file's `expected_scores` (None when it pins nothing); read as YAML, without composing the
    config, so the check needs no training stack."""
    path = EXPERIMENTS / f"{experiment}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown experiment {experiment!r}; valid experiments: {', '.join(experiment_names())}")
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("expected_scores")


def pinned_experiments() -> list[str]:
    return [name for name in experiment_names() if pinned(name)]


def measured(results: dict, name: str) -> float:
    """One named score of a results.json record."""
    if name == "best_dev":
        value = (results.get("provenance", {}).get("model") or {}).get("best_dev")
    else:
        parts = name.split("/")
        if len(parts) != 3:
            raise ConfigError(f"expected score {name!r} is not `best_dev` or `<family>/<pooler>/<task>`")
        family, pooler, task = parts
        families = results.get("families") or {"sts": {"scores": results.get("scores", {})}}
        value = families.get(family, {}).get("scores", {}).get(pooler, {}).get(task)
    if value is None:
        raise DataError(f"the run's results.json has no score {name!r}; does the run use the recipe's poolers/tasks?")
    return float(value)


def compare(expected: dict, results: dict) -> list[dict]:
    """One row per pinned score: expected, measured, difference, and whether it is inside the band."""
    tolerance = float(expected.get("tolerance", 0.5))
    rows = []
    for name, value in (expected.get("scores") or {}).items():
        got = measured(results, name)
        rows.append({"score": name, "expected": float(value), "measured": got, "difference": got - float(value),
                     "tolerance": tolerance, "ok": abs(got - float(value)) <= tolerance})
    if not rows:
        raise ConfigError("expected_scores lists no scores; give `scores: {name: value}`")
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| score | expected | measured | difference | band | status |", "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['score']} | {r['expected']:.2f} | {r['measured']:.2f} | {r['difference']:+.2f} | "
              f"±{r['tolerance']:.2f} | {'ok' if r['ok'] else 'OUT OF BAND'} |" for r in rows]
    return "\n".join(lines) + "\n"


def check_run(experiment: str, run_dir: str | Path) -> list[dict]:
    expected = pinned(experiment)
    if not expected:
        raise ConfigError(f"experiment {experiment!r} pins no expected_scores; "
                          f"pinned: {', '.join(pinned_experiments())}")
    path = Path(run_dir) / "results.json"
    if not path.is_file():
        raise DataError(f"{path} does not exist; pass the folder of a finished run")
    return compare(expected, json.loads(path.read_text(encoding="utf-8")))


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    rows = check_run(args.experiment, args.run_dir)
    print(table(rows), end="")
    if not all(row["ok"] for row in rows):
        print(f"error: {sum(not r['ok'] for r in rows)} score(s) of {args.experiment} left their band",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
