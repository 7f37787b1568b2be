"""Startup cost of the three commands: how often each composes its Hydra configuration, how long a typical mistake
takes to be answered with its one-line error, and how long the quickstart takes to reach its first training step,
each also as a ratio to `python -c "import torch"` measured in the same run.

    python bench/startup.py [--repo DIR] [--repeats 3] [--skip-first-step] [--json]

`--repo`: the checkout to measure (its own .venv/bin/python runs the commands; default this one), so two checkouts
compare in one run: `--repo ../before` then this one, or both through `--repo` one after the other. On a shared,
loaded machine wall times move with the load: the ratios to `import torch` in the same run are the figures to
compare. The goal line: one composition per command; every error within 2x `import torch`.

Compositions are counted by wrapping Hydra's `ConfigLoaderImpl.load_configuration` (what `@hydra.main`, `compose`
and every check that composes call). The first training step is timed by a callback added to the quickstart's
config (`+callbacks.first_step._target_=...`), which writes the seconds since the command started and ends the
process at the end of the first optimiser step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: (name, command line after the interpreter, environment changes): five typical mistakes.
MISTAKES = [
    ("unknown pooler", ["evaluate.py", "poolers=[meen]"], {}),
    ("negative learning rate", ["train.py", "experiment=quickstart_unsup", "optimizer.lr=-1"], {}),
    ("unknown key", ["train.py", "experiment=quickstart_unsup", "seeed=1"], {}),
    ("missing data folder", ["evaluate.py", "poolers=[mean]"], {"PROMPTEMB_DATA": "/nonexistent/promptemb-data"}),
    ("unknown experiment", ["train.py", "experiment=does_not_exist"], {}),
]
#: (name, command line) whose compositions are counted: a run that is refused only after composing (a bad value)
#: composes as often as one that runs, and stops before any model loads.
COUNTED = [
    ("evaluate.py", ["evaluate.py", "poolers=[mean]", "backbone.batch_size=0"]),
    ("train.py", ["train.py", "experiment=quickstart_unsup", "optimizer.lr=-1"]),
    ("export.py", ["export.py", "ckpt_path=/nonexistent.ckpt"]),
]

COUNTER = """
import atexit, os, runpy, sys
from hydra._internal import config_loader_impl as impl
count = [0]
original = impl.ConfigLoaderImpl.load_configuration
def counted(self, *args, **kwargs):
    count[0] += 1
    return original(self, *args, **kwargs)
impl.ConfigLoaderImpl.load_configuration = counted
atexit.register(lambda: open(os.environ["STARTUP_COUNT_FILE"], "w").write(str(count[0])))
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""

FIRST_STEP = """
import os, time
import pytorch_lightning as pl

class FirstStepTimer(pl.Callback):
    def __init__(self):
        super().__init__()

    def on_train_batch_end(self, trainer, *args, **kwargs):
        with open(os.environ["STARTUP_FIRST_STEP_FILE"], "w") as handle:
            handle.write(str(time.time() - float(os.environ["STARTUP_T0"])))
        os._exit(0)
"""


def python_of(repo: Path) -> str:
    venv = repo / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def run(repo: Path, args: list[str], env: dict | None = None,
        timeout: int = 900) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run([python_of(repo), *args], cwd=repo, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return time.perf_counter() - started, proc


def one_line_error(proc: subprocess.CompletedProcess) -> str | None:
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 0 or "Traceback" in proc.stderr or not lines or not lines[-1].startswith("error: "):
        return None
    return lines[-1]


def measure(repo: Path, repeats: int, first_step: bool, scratch: Path) -> dict:
    env = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PROMPTEMB_DATA": os.environ.get("PROMPTEMB_DATA", str((repo.parent / "shared" / "data").resolve()))}
    figures: dict = {"repo": str(repo), "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                                                                 capture_output=True, text=True).stdout.strip()}
    torch_times = [run(repo, ["-c", "import torch"], env)[0] for _ in range(repeats)]
    figures["import_torch_s"] = statistics.median(torch_times)
    counts = {}
    for name, args in COUNTED:
        count_file = scratch / f"count-{name}"
        count_file.unlink(missing_ok=True)
        _, proc = run(repo, ["-c", COUNTER, *args], {**env, "STARTUP_COUNT_FILE": str(count_file),
                                                     "PYTHONPATH": str(repo)})
        counts[name] = int(count_file.read_text()) if count_file.exists() else None
    figures["compositions"] = counts
    errors = {}
    for name, args, extra in MISTAKES:
        times, line = [], None
        for _ in range(repeats):
            seconds, proc = run(repo, args, {**env, **extra})
            times.append(seconds)
            line = one_line_error(proc)
        seconds = statistics.median(times)
        errors[name] = {"command": " ".join(args), "seconds": round(seconds, 2),
                        "ratio_to_import_torch": round(seconds / figures["import_torch_s"], 2), "error": line}
    figures["errors"] = errors
    if first_step:
        module = scratch / "startup_first_step.py"
        module.write_text(FIRST_STEP)
        step_file = scratch / "first-step"
        step_file.unlink(missing_ok=True)
        t0 = time.time()
        run(repo, ["train.py", "experiment=quickstart_unsup", f"output_dir={scratch / ('run-' + figures['commit'])}",
                   "+callbacks.first_step._target_=startup_first_step.FirstStepTimer"],
            {**env, "PYTHONPATH": str(scratch), "STARTUP_T0": str(t0), "STARTUP_FIRST_STEP_FILE": str(step_file)})
        figures["first_training_step_s"] = round(float(step_file.read_text()), 1) if step_file.exists() else None
    return figures


def show(figures: dict) -> None:
    torch_s = figures["import_torch_s"]
    print(f"{figures['repo']} at {figures['commit']}: import torch {torch_s:.2f} s")
    print("  compositions per command: " + ", ".join(f"{k} {v}" for k, v in figures["compositions"].items()))
    for name, row in figures["errors"].items():
        status = "one line" if row["error"] else "NOT a one-line error"
        print(f"  {name:24s} {row['seconds']:6.2f} s  {row['ratio_to_import_torch']:5.2f}x import torch  ({status})")
    if figures.get("first_training_step_s") is None and "first_training_step_s" in figures:
        print("  quickstart's first training step: the run did not reach it")
    elif "first_training_step_s" in figures:
        print(f"  quickstart's first training step after {figures['first_training_step_s']} s "
              f"({figures['first_training_step_s'] / torch_s:.1f}x import torch)")
    worst = max(row["ratio_to_import_torch"] for row in figures["errors"].values())
    compositions = max(v or 0 for v in figures["compositions"].values())
    print(f"  goal: 1 composition per command (now at most {compositions}); every error within 2x import torch "
          f"(now at most {worst:.2f}x): {'met' if compositions <= 1 and worst <= 2 else 'not met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, action="append", help="checkout(s) to measure (default: this one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-first-step", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for repo in args.repo or [HERE]:
            figures = measure(repo.resolve(), args.repeats, not args.skip_first_step, Path(scratch))
            show(figures)
            results.append(figures)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
