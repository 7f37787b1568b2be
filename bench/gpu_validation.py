"""GPU validation: one call, one absolute deadline, everything a GPU can tell us, in order of value.

    export GV_DEADLINE=$(( $(date +%s) + 540 )); source .gpu/setup.sh && \\
        python bench/gpu_validation.py --out "$OUT/gv" --deadline "$GV_DEADLINE"
    python bench/gpu_validation.py --rehearse --out DIR          # the same plan on a CPU, tiny models

The deadline (seconds since the epoch) is set before `source .gpu/setup.sh`, so the set-up's time counts; without
`--deadline` it is `SETUP_ALLOWANCE` seconds short of `BUDGET` from this script's start. Parts, in order of value
(PLAN gives each its time limit; a part gets the smaller of its limit and what the deadline leaves, and is skipped,
said so, when less than its minimum is left):

1. `paper_recipe`: the paper recipe's own GPU command, `train.py experiment=promptbert_unsup trainer=gpu`, on bert-base
   randomly initialised (`BertConfig()`, MiniLM's uncased vocabulary) and the local Wikipedia sample, 20 optimiser
   steps, STS-B dev at 0, 10 and 20: exit code, peak memory, training steps/s (the steps alone, bench/step_timer.py);
2. `matmul_peak`: the bf16 matmul peak of this device, measured (bench/matmul_peak.py: 8192³ GEMMs for 3 s);
3. `train_loop`: the real train.py loop (bench/train_throughput.py --mode loop) on bert-base, batch 256, bf16-mixed,
   eager then `trainer.compile=true`: steady step, tokens/s, MFU against the data-sheet dense bf16 peak and against
   the measured peak, and the compiled run's compile time apart from its steady step;
4. `suite`: the evaluation suite (7 STS + 9 transfer + 8 clustering; MiniLM, `mean`) in one evaluate.py process
   (bench/evaluation_suite.py): wall time and its split, every score;
5. `encode`: the project's encoding against `SentenceTransformer.encode` on this device, both with their defaults
   (bench/encode_throughput.py --defaults-only);
6. `gpu_cpu_scores`: the STS table of the same MiniLM weights on this machine's CPU (evaluate.py
   `backbone.device=cpu`), each task's difference to the suite's GPU score (goal <= 0.05);
7. `other_recipes`: the six other paper experiments' GPU commands on random models of their families, while time
   is left;
8. `pytest_gpu`: `pytest -m gpu` (tests/training/test_gpu_cuda.py), while time is left.

Every part runs as subprocesses in their own process group: a part's time-out kills the whole group (evaluate.py
under the suite's driver included), and so does a SIGTERM/SIGINT of this script. After each part the report
(`gpu_validation.json` and `gpu_validation.md` in `--out`) is rewritten atomically, so a call killed at its limit still
returns every finished part, and the part prints one line with its figure. `--rehearse` runs the same plan on a
machine without CUDA: the CUDA device profile on the CPU (`PROMPTEMB_REHEARSE_CUDA=1`, common/device_profile.py),
tiny models, 2 steps, small workloads (`pytest -m gpu` cannot be rehearsed and is skipped); without it the CUDA parts
are refused in one line on a machine without CUDA. Exit code: 0 when every part that ran finished, 1 otherwise, 2 for
a refused command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from unittest.mock import patch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.random_models import MINILM, WIKI_SAMPLE, save_family  # noqa: E402
from promptemb.common.device_profile import REHEARSE_CUDA  # noqa: E402
from promptemb.common.io import atomic_write_json, atomic_write_text  # noqa: E402

#: The whole call's wall budget (seconds) and the part of it `source .gpu/setup.sh` takes before this script starts
#: (19-26 s seen on an H200).
BUDGET, SETUP_ALLOWANCE = 540, 30
#: Seconds kept back at the end for the last report.
REPORT_RESERVE = 3
#: The paper experiment the first part runs, and the six others (their architecture family; the supervised ones train
#: on SICK triplets here).
PAPER_RECIPE = "promptbert_unsup"
RECIPES = {"promptbert_unsup": "bert", "promptbert_unsup_roberta": "roberta", "promptbert_sup": "bert",
           "promptbert_sup_roberta": "roberta", "optiprompt": "bert", "optiprompt_roberta": "roberta",
           "prompteol_sup": "llama"}
RECIPE_STEPS, REHEARSAL_STEPS = 20, 2
#: The loop runs: batch, timed steps after warm-up steps (the compiled run's warm-up compiles).
LOOP_BATCH, LOOP_STEPS, LOOP_WARMUP = 256, 10, 3
#: Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by device-name fragment; the first match is used.
DENSE_BF16_PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0),
                          ("A10G", 70.0), ("L4", 121.0), ("4090", 165.0))
EPOCH_SENTENCES = 1_000_000
SCORE_GOAL = 0.05
SUITE_TASKS = "sts,transfer,clustering"
#: A rehearsal's deadline when none is given (seconds from its start): the CPU takes what it takes.
REHEARSAL_DEADLINE = 24 * 3600
#: The rehearsal's suite: one task of each family, small.
REHEARSAL_SUITE_TASKS = "STS16,SICK-E,tweet"


@dataclass(frozen=True)
class Part:
    name: str
    limit: float | None  # seconds; None: whatever the deadline leaves
    minimum: float  # skipped when less than this is left
    needs_cuda: bool
    what: str


PLAN = (
    Part("paper_recipe", 100, 45, True, "train.py experiment=promptbert_unsup trainer=gpu, bert-base, 20 steps"),
    Part("matmul_peak", 15, 8, True, "bf16 GEMMs, 8192^3, 3 s"),
    Part("train_loop", 160, 40, True, "real loop, bert-base, batch 256, bf16: eager then trainer.compile=true"),
    Part("suite", 100, 30, False, "7 STS + 9 transfer + 8 clustering, MiniLM, mean, one evaluate.py"),
    Part("encode", 50, 20, False, "Encoder defaults vs SentenceTransformer.encode defaults, 20,000 sentences"),
    Part("gpu_cpu_scores", 55, 25, False, "the 7 STS tasks on this machine's CPU vs the suite's GPU scores"),
    Part("other_recipes", None, 45, True, "the six other experiments' GPU commands, 20 steps each, while time lasts"),
    Part("pytest_gpu", None, 20, True, "pytest -m gpu (tests/training/test_gpu_cuda.py)"),
)
PARTS = tuple(part.name for part in PLAN)
#: Parts that cannot run on a CPU, even rehearsed.
CUDA_ONLY_PARTS = ("pytest_gpu",)


def budget_table() -> list[tuple[str, float | None]]:
    """(part, limit in seconds) of the GPU plan, the set-up first; the fixed limits sum to at most BUDGET and the
    parts without a limit share what is left."""
    return [("setup (.gpu/setup.sh, before this script)", SETUP_ALLOWANCE),
            *((part.name, part.limit) for part in PLAN)]


def dense_bf16_peak(device_name: str) -> float | None:
    return next((peak for fragment, peak in DENSE_BF16_PEAK_TFLOPS if fragment in device_name), None)


# -- subprocesses in their own process group --------------------------------------------------------------------------

_running: subprocess.Popen | None = None


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run(command: list[str], timeout: float, env: dict | None = None) -> dict:
    """A subprocess (in a process group of its own) with its exit code, wall time and last lines; at `timeout` the
    whole group is killed."""
    global _running
    started = time.perf_counter()
    if timeout <= 0:
        return {"command": " ".join(map(str, command)), "exit_code": None, "wall_s": 0.0,
                "tail": ["not started: no time left"]}
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(list(map(str, command)), cwd=REPO, stdout=output, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **(env or {})})
        _running = proc
        try:
            code = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code, timed_out = None, True
        finally:
            _running = None
        output.seek(0)
        tail = output.read().strip().splitlines()[-15:]
    if timed_out:
        tail.append(f"timed out after {timeout:.0f} s: its process group was killed")
    return {"command": " ".join(map(str, command)), "exit_code": code,
            "wall_s": round(time.perf_counter() - started, 1), "tail": tail}


def _stop(signum, frame) -> None:
    """SIGTERM/SIGINT (the caller's own limit): the running part's whole group goes too."""
    if _running is not None:
        _kill_group(_running)
    raise SystemExit(128 + signum)


# -- the parts --------------------------------------------------------------------------------------------------------


@dataclass
class Context:
    work: Path
    data_root: str | None
    rehearse: bool
    deadline: float  # time.time()
    suite_tasks: str = SUITE_TASKS
    models: dict[str, Path] = field(default_factory=dict)
    report: dict = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.time() - REPORT_RESERVE

    def model(self, family: str) -> Path:
        """A randomly initialised model of the family (full size, or tiny when rehearsing), saved once."""
        if family not in self.models:
            from promptemb.data.root import resolve_data_root

            self.models[family] = save_family(family, self.work / f"{family}_random",
                                              resolve_data_root(self.data_root), tiny=self.rehearse)
        return self.models[family]

    def data_override(self) -> list[str]:
        return [f"data_root={self.data_root}"] if self.data_root else []


def recipe_command(name: str, model: Path, out: Path, steps: int, data_root: str | None, rehearse: bool) -> list[str]:
    """`train.py experiment=NAME trainer=gpu` on local data for `steps` optimiser steps (epochs unbounded), STS-B dev
    at 0, steps/2 and steps, the final table on STS-B (its test split), with the step timer. The recipe's own batch,
    except where the local corpus is smaller (SICK's 494 triplets: 256) and in a CPU rehearsal (8)."""
    supervised = name.startswith(("promptbert_sup", "prompteol"))
    data = ["data=sick_triplets"] if supervised else ["data.download=null", f"data.files=[{WIKI_SAMPLE}]"]
    batch = 8 if rehearse else 256 if supervised else None
    return [sys.executable, "train.py", f"experiment={name}", "trainer=gpu", f"backbone.name_or_path={model}", *data,
            *([f"data.batch_size={batch}"] if batch else []), f"output_dir={out / 'run'}",
            f"trainer.max_steps={steps}", "trainer.max_epochs=-1", f"eval_every_n_steps={max(1, steps // 2)}",
            "callbacks.sts_evaluation.final_tasks=[STSBenchmark]",
            "+callbacks.step_timer._target_=bench.step_timer.StepTimer",
            f"+callbacks.step_timer.out={out / 'timer.json'}", f"+callbacks.step_timer.warmup={0 if rehearse else 2}",
            *([f"data_root={data_root}"] if data_root else [])]


def run_recipe(ctx: Context, name: str, limit: float) -> dict:
    started = time.perf_counter()
    model = ctx.model(RECIPES[name])
    out = ctx.work / "recipes" / name
    steps = REHEARSAL_STEPS if ctx.rehearse else RECIPE_STEPS
    record = run(recipe_command(name, model, out, steps, ctx.data_root, ctx.rehearse),
                 limit - (time.perf_counter() - started))
    timer = out / "timer.json"
    if timer.is_file():
        record["result"] = json.loads(timer.read_text())
    record["model"] = ("tiny " if ctx.rehearse else "") + RECIPES[name] + " (random init)"
    return record


def recipe_figure(name: str, record: dict) -> str:
    timed = record.get("result") or {}
    return (f"{name} exit {record.get('exit_code')}, {timed.get('optimizer_steps')} steps, "
            f"{timed.get('steps_per_s')} training steps/s, peak {timed.get('peak_memory_gib')} GiB, "
            f"{record.get('wall_s')} s")


def paper_recipe(ctx: Context, limit: float) -> tuple[dict, str]:
    record = run_recipe(ctx, PAPER_RECIPE, limit)
    return record, recipe_figure(PAPER_RECIPE, record)


def matmul_peak(ctx: Context, limit: float) -> tuple[dict, str]:
    out = ctx.work / "matmul_peak.json"
    record = run([sys.executable, "bench/matmul_peak.py", "--seconds", "0.5" if ctx.rehearse else "3",
                  "--out", out], limit)
    if out.is_file():
        record["result"] = json.loads(out.read_text())
    result = record.get("result") or {}
    return record, (f"{result.get('tflops')} TFLOP/s measured ({result.get('dtype')}, {result.get('size')}^3; "
                    f"data-sheet dense bf16 {ctx.report.get('dense_bf16_peak_tflops')})")


def train_loop(ctx: Context, limit: float) -> tuple[dict, str]:
    """Eager, then compiled: bench/train_throughput.py --mode loop on bert-base (tiny when rehearsing)."""
    deadline = time.perf_counter() + limit
    model = ctx.model("bert")
    batch, steps, warmup = (8, 2, 1) if ctx.rehearse else (LOOP_BATCH, LOOP_STEPS, LOOP_WARMUP)
    common = ["experiment=promptbert_unsup", "trainer=gpu", f"backbone.name_or_path={model}",
              f"data.batch_size={batch}", "data.download=null", f"data.files=[{WIKI_SAMPLE}]",
              f"data.cache_dir={ctx.work / 'cache'}", *ctx.data_override()]
    spec = ctx.report.get("dense_bf16_peak_tflops")
    measured = ((ctx.report["parts"].get("matmul_peak") or {}).get("result") or {}).get("tflops")
    runs = {}
    for name, extra, share in (("eager", [], 0.35), ("compiled", ["trainer.compile=true"], 1.0)):
        out = ctx.work / f"loop_{name}.json"
        left = deadline - time.perf_counter()
        record = run([sys.executable, "bench/train_throughput.py", *common, *extra, "--mode", "loop", "--steps",
                      steps, "--warmup", warmup, *(["--device", "cpu"] if ctx.rehearse else []), "--out", out],
                     left * share)
        if out.is_file():
            result = json.loads(out.read_text())["loop"]
            record["result"] = {key: result[key] for key in (
                "steps", "warmup_seconds", "step_seconds_mean", "steps_per_s", "sentences_per_s", "real_tokens_per_s",
                "achieved_tflops", *(key for key in result if key.startswith("peak_"))) if key in result}
            record["result"]["mfu_vs_data_sheet"] = result["achieved_tflops"] / spec if spec else None
            record["result"]["mfu_vs_measured_peak"] = result["achieved_tflops"] / measured if measured else None
            sentences_per_s = result.get("sentences_per_s")
            if sentences_per_s:
                record["projected_epoch_1M_sentences_min"] = round(EPOCH_SENTENCES / sentences_per_s / 60, 2)
        runs[name] = record
    eager, compiled = (runs[name].get("result") or {} for name in ("eager", "compiled"))
    if eager.get("warmup_seconds") is not None and compiled.get("warmup_seconds") is not None:
        runs["compiled"]["compile_seconds"] = round(compiled["warmup_seconds"] - eager["warmup_seconds"], 1)

    def figure(name: str) -> str:
        result = runs[name].get("result") or {}
        if not result:
            return f"{name} exit {runs[name].get('exit_code')}"
        mfu = "/".join("-" if result.get(key) is None else f"{100 * result[key]:.1f}%"
                       for key in ("mfu_vs_data_sheet", "mfu_vs_measured_peak"))
        return (f"{name} step {1e3 * result['step_seconds_mean']:.0f} ms, {result['real_tokens_per_s']:,.0f} tokens/s, "
                f"MFU {mfu} (data sheet/measured)")

    compile_s = runs["compiled"].get("compile_seconds")
    return {"batch": batch, "runs": runs}, "; ".join([figure("eager"), figure("compiled")]) + (
        f"; compile {compile_s} s" if compile_s is not None else "")


def suite(ctx: Context, limit: float) -> tuple[dict, str]:
    figures = ctx.work / "suite.json"
    tasks = ctx.suite_tasks
    record = run([sys.executable, "bench/evaluation_suite.py", "--model", MINILM, "--tasks", tasks, "--output",
                  figures, *ctx.data_override()], limit)
    if figures.is_file():
        record["result"] = json.loads(figures.read_text())
    split = (record.get("result") or {}).get("split") or {}
    families = ", ".join(f"{family} {part['encode_s'] + part['score_s']:.1f} s"
                         for family, part in (split.get("families") or {}).items())
    return record, (f"{split.get('process_wall_s')} s wall ({families}; start-up {split.get('start_up_s')} s) for "
                    f"{tasks}" if split else f"exit {record.get('exit_code')}")


def encode(ctx: Context, limit: float) -> tuple[dict, str]:
    out = ctx.work / "encode.json"
    record = run([sys.executable, "bench/encode_throughput.py", "--model", MINILM, "--defaults-only", "--sentences",
                  256 if ctx.rehearse else 20000, "--repeats", 1 if ctx.rehearse else 2, "--out", out,
                  *(["--data-root", ctx.data_root] if ctx.data_root else [])], limit)
    if out.is_file():
        record["result"] = json.loads(out.read_text())
    result = record.get("result") or {}
    rates = result.get("sentences_per_s") or {}
    return record, (f"{result.get('defaults_vs_sentence_transformers_defaults')}x SentenceTransformer.encode "
                    f"({', '.join(f'{side} {rate:,.0f}/s' for side, rate in rates.items())}; max unit-embedding "
                    f"difference {result.get('max_abs_diff_unit_embeddings', float('nan')):.1e})" if result
                    else f"exit {record.get('exit_code')}")


def sts_scores(table: dict) -> dict[str, float]:
    """Task -> Spearman x 100 of the first pooler of an STS score table ({pooler: {task: score, "avg": ...}}),
    the average left out."""
    scores = next(iter(table.values()), {}) if table else {}
    return {task: score for task, score in scores.items() if task != "avg"}


def results_sts_scores(results_json: Path) -> dict[str, float]:
    return sts_scores(json.loads(results_json.read_text())["families"]["sts"]["scores"])


def gpu_cpu_scores(ctx: Context, limit: float) -> tuple[dict, str]:
    """The suite's STS tasks, scored again on this machine's CPU with the same weights; the difference per task."""
    suite_result = (ctx.report["parts"].get("suite") or {}).get("result") or {}
    device_scores = sts_scores(suite_result.get("scores", {}).get("sts") or {})
    started = time.perf_counter()
    record: dict = {}
    if not device_scores:  # the suite did not finish: score the STS tasks on the device first
        out = ctx.work / "sts_device"
        record["device_run"] = run([sys.executable, "evaluate.py", f"backbone.name_or_path={MINILM}", "poolers=[mean]",
                                    "tasks=[sts]", f"output_dir={out}", "progress=false", *ctx.data_override()],
                                   limit / 2)
        if (out / "results.json").is_file():
            device_scores = results_sts_scores(out / "results.json")
    tasks = list(device_scores) or ["sts"]
    out = ctx.work / "sts_cpu"
    record.update(run([sys.executable, "evaluate.py", f"backbone.name_or_path={MINILM}", "poolers=[mean]",
                       f"tasks=[{','.join(tasks)}]", "backbone.device=cpu", f"output_dir={out}", "progress=false",
                       *ctx.data_override()], limit - (time.perf_counter() - started)))
    if not (out / "results.json").is_file() or not device_scores:
        return record, f"exit {record.get('exit_code')}"
    cpu = results_sts_scores(out / "results.json")
    differences = {task: round(device_scores[task] - cpu[task], 4) for task in device_scores if task in cpu}
    record["result"] = {"device": device_scores, "cpu": cpu, "difference": differences,
                        "max_abs_difference": max(map(abs, differences.values())), "goal": SCORE_GOAL}
    worst = record["result"]["max_abs_difference"]
    return record, (f"max abs(device - CPU) {worst:.4f} (goal <= {SCORE_GOAL}): "
                    + ", ".join(f"{task} {value:+.4f}" for task, value in differences.items()))


def other_recipes(ctx: Context, limit: float) -> tuple[dict, str]:
    deadline = time.perf_counter() + limit
    minimum = next(part.minimum for part in PLAN if part.name == "other_recipes")
    runs, skipped = {}, []
    for name in RECIPES:
        if name == PAPER_RECIPE:
            continue
        left = deadline - time.perf_counter()
        if left < minimum:
            skipped.append(name)
            continue
        runs[name] = run_recipe(ctx, name, left)
    figure = "; ".join(recipe_figure(name, record) for name, record in runs.items())
    if skipped:
        figure += ("; " if figure else "") + f"skipped (deadline near): {', '.join(skipped)}"
    return {"runs": runs, "skipped": skipped}, figure


def pytest_gpu(ctx: Context, limit: float) -> tuple[dict, str]:
    record = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gpu",
                  "tests/training/test_gpu_cuda.py"], limit)
    return record, f"exit {record.get('exit_code')}: {(record.get('tail') or [''])[-1]}"


RUNNERS: dict[str, Callable[[Context, float], tuple[dict, str]]] = {
    "paper_recipe": paper_recipe, "matmul_peak": matmul_peak, "train_loop": train_loop, "suite": suite,
    "encode": encode, "gpu_cpu_scores": gpu_cpu_scores, "other_recipes": other_recipes, "pytest_gpu": pytest_gpu}


# -- the report -------------------------------------------------------------------------------------------------------


def write_report(out: Path, report: dict) -> None:
    atomic_write_json(out / "gpu_validation.json", report)
    atomic_write_text(out / "gpu_validation.md", markdown(report))


def markdown(report: dict) -> str:
    lines = [f"# GPU validation: {report['device']}", "",
             f"{report['versions']}; started {report['started']}, deadline {report['deadline']} "
             f"({report['budget_s']} s from the start of the call)", "",
             "| part | limit s | status | wall s | figure |", "|---|---:|---|---:|---|"]
    for name, limit in report["budget"]:
        part = report["parts"].get(name)
        if name.startswith("setup"):
            lines.append(f"| {name} | {limit} | before the script | | |")
        elif part is None:
            status = "not reached" if name in report.get("asked", ()) else "not asked"
            lines.append(f"| {name} | {limit or 'rest'} | {status} | | |")
        else:
            lines.append(f"| {name} | {limit or 'rest'} | {part['status']} | {part.get('part_wall_s', '')} | "
                         f"{part.get('figure', '').replace('|', '/')} |")
    for name, part in report["parts"].items():
        lines += ["", f"## {name}", "", part.get("figure", ""), ""]
        records = part.get("runs") or {name: part}
        for run_name, record in records.items():
            if "command" not in record:
                continue
            lines += [f"### {run_name}" if len(records) > 1 else "", "", f"`{record['command']}`", "",
                      f"exit code {record.get('exit_code')}, {record.get('wall_s')} s"]
            measured = record.get("result")
            if isinstance(measured, dict):
                lines += [f"- {key}: {value}" for key, value in measured.items() if not isinstance(value, dict | list)]
            for key in ("compile_seconds", "projected_epoch_1M_sentences_min"):
                if record.get(key) is not None:
                    lines.append(f"- {key}: {record[key]}")
            lines += ["", "```", *record.get("tail", [])[-8:], "```", ""]
    return "\n".join(lines) + "\n"


def versions() -> str:
    import importlib.metadata as metadata

    names = ("torch", "pytorch-lightning", "transformers", "sentence-transformers")
    found = []
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name} {metadata.version(name)}")
    return ", ".join(found) + f", CUDA {torch.version.cuda}, Python {sys.version.split()[0]}"


def failed_runs(report: dict) -> list[str]:
    """The runs that ran and did not exit 0 (a refused or skipped part is not one)."""
    failed = []
    for part, result in report["parts"].items():
        for name, record in (result.get("runs") or {part: result}).items():
            if "command" in record and record.get("exit_code") != 0:
                failed.append(name if name == part else f"{part}/{name}")
    return failed


# -- the command ------------------------------------------------------------------------------------------------------


def run_part(ctx: Context, part: Part, refused: list[str]) -> dict:
    """One part of the plan: refused, skipped (less than its minimum left before the deadline) or run within the
    smaller of its limit (a rehearsal: none) and what the deadline leaves."""
    left = ctx.left()
    if part.name in refused:
        return {"status": "refused", "refused": "needs a CUDA GPU; this machine has none",
                "figure": "refused: needs a CUDA GPU"}
    if left < part.minimum:
        return {"status": "skipped", "figure": f"skipped: {left:.0f} s left before the deadline, the part needs "
                                               f"{part.minimum:.0f}"}
    limit = left if part.limit is None or ctx.rehearse else min(part.limit, left)
    started = time.perf_counter()
    result, figure = RUNNERS[part.name](ctx, limit)
    return {**result, "status": "ran", "limit_s": round(limit), "part_wall_s": round(time.perf_counter() - started, 1),
            "figure": figure}


@contextlib.contextmanager
def stopping_kills_the_running_part():
    """SIGTERM and SIGINT (the caller's own limit, Ctrl-C) kill the running part's process group, then end this
    process; the handlers before are restored after."""
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)



def main(argv: list[str] | None = None) -> int:
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "logs" / "gpu_validation")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--deadline", type=float, default=None,
                        help=f"seconds since the epoch by which everything ends (default: {BUDGET - SETUP_ALLOWANCE} "
                             "s from now; a rehearsal: none)")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--suite-tasks", default=None,
                        help=f"the suite's evaluate.py tasks (default {SUITE_TASKS}; a rehearsal: "
                             f"{REHEARSAL_SUITE_TASKS})")
    parser.add_argument("--rehearse", action="store_true",
                        help="the same plan on the CPU with the CUDA device profile, tiny models, small workloads")
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        print(f"error: unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    deadline = args.deadline if args.deadline is not None else started + (
        REHEARSAL_DEADLINE if args.rehearse else BUDGET - SETUP_ALLOWANCE)
    if deadline - started < 10:
        print(f"error: --deadline {args.deadline:.0f} leaves {deadline - started:.0f} s; give a time at least 10 s "
              "ahead (e.g. $(( $(date +%s) + 540 )))", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if args.rehearse and cuda:
        print("error: --rehearse runs the CUDA parts on a machine without CUDA; this one has a GPU: drop --rehearse",
              file=sys.stderr)
        return 2
    plan = [part for part in PLAN if part.name in parts]
    refused = [part.name for part in plan if part.needs_cuda and not cuda
               and (not args.rehearse or part.name in CUDA_ONLY_PARTS)]
    if refused:
        verb = "needs" if len(refused) == 1 else "need"
        rest = "running the rest" if len(refused) < len(plan) else "nothing else to run"
        how = "cannot be rehearsed on the CPU" if args.rehearse else (
            "a CUDA GPU and this machine has none (torch.cuda.is_available() is False; --rehearse runs the others "
            "on the CPU)")
        print(f"error: {', '.join(refused)} {'' if args.rehearse else verb + ' '}{how}; {rest}", file=sys.stderr)
        if len(refused) == len(plan):
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if cuda else "CPU (no CUDA)"
    report = {"device": device + (", rehearsing the CUDA profile" if args.rehearse else ""), "versions": versions(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
              "deadline": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deadline)),
              "budget_s": round(deadline - started),
              "rehearsal": args.rehearse, "dense_bf16_peak_tflops": dense_bf16_peak(device) if cuda else None,
              "budget": budget_table(), "asked": [part.name for part in plan], "parts": {}}
    # every train.py the parts start rehearses the CUDA profile; the caller's environment comes back afterwards
    rehearsal = patch.dict(os.environ, {REHEARSE_CUDA: "1"} if args.rehearse else {})
    with stopping_kills_the_running_part(), rehearsal, tempfile.TemporaryDirectory(prefix="gpu-") as scratch:
        tasks = args.suite_tasks or (REHEARSAL_SUITE_TASKS if args.rehearse else SUITE_TASKS)
        ctx = Context(Path(scratch), args.data_root, args.rehearse, deadline, tasks, report=report)
        for part in plan:
            report["parts"][part.name] = run_part(ctx, part, refused)
            write_report(args.out, report)
            print(f"{part.name}: {report['parts'][part.name]['figure']}", flush=True)
    print(f"wrote {args.out / 'gpu_validation.json'} and {args.out / 'gpu_validation.md'}")
    failed = failed_runs(report)
    if failed:
        print(f"error: {', '.join(failed)} did not run to completion (exit codes in the report)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
