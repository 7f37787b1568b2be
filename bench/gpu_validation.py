"""GPU validation: one command, no network, one JSON + markdown report (put it into docs/benchmarks.md).

    python bench/gpu_validation.py [--out DIR] [--parts recipes,pytest,throughput,quickstart,suite,encode]
        [--suite-tasks sts,...] [--rehearse]

Parts (each run as subprocesses with their own time limit, so one failing part does not stop the others):

* `recipes`: every paper experiment's own GPU command, `train.py experiment=NAME trainer=gpu`, on its architecture at
  random initialisation (`BertConfig()`, `RobertaConfig()` with a BPE tokenizer built here, a small `LlamaConfig`
  for prompteol_sup; bench/random_models.py) with local data (the unsupervised recipes on the Wikipedia sample, the
  supervised ones on `data=sick_triplets`), 20 optimiser steps with STS-B dev evaluations at 0, 10 and 20: exit
  code, steps/s of the real loop and peak memory (bench/step_timer.py);
* `pytest`: `pytest -m gpu` (tests/training/test_gpu_cuda.py: gradient caching under bf16, dropout replay in pass 2,
  sharded dev evaluation = one process, final scoring on the training device, same-device-count resume);
* `throughput`: bench/train_throughput.py on bert-base randomly initialised from its config with local data:
  promptbert_unsup (bf16-mixed, batch 64 and 256, 32 sentence tokens) and promptbert_sup (SICK triplets); tokens/s,
  step phases, peak memory, MFU against the device's dense bf16 peak, and the projected time of one epoch of 1M
  sentences;
* `quickstart`: `train.py experiment=quickstart_unsup trainer=gpu`: its dev curve next to the CPU's pinned values;
* `suite`: the evaluation suite (7 STS + 9 transfer + 8 clustering by default; MiniLM, `mean`) in one evaluate.py
  process, bench/evaluation_suite.py: wall time, its split, sentences/s and every score (to compare with the CPU's
  pinned tables);
* `encode`: bench/encode_throughput.py, the project's encoding against `SentenceTransformer.encode` on this device,
  both with their defaults, and the agreement of their embeddings.

`recipes`, `pytest`, `throughput` and `quickstart` need CUDA: on a machine without it they are refused in one line
(the command exits 2 when nothing else was asked for); `suite` and `encode` run anywhere. `--rehearse` runs the CUDA
parts on the CPU instead, through the same code path: the CUDA device profile rehearsed
(`PROMPTEMB_REHEARSE_CUDA=1`, see common/device_profile.py), tiny models of each family, 2 steps (`pytest -m gpu`
cannot be rehearsed). The report is written whatever happens; the command exits 1 when a run that ran did not exit 0.
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
from unittest.mock import patch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.random_models import MINILM, WIKI_SAMPLE, save_family  # noqa: E402
from promptemb.common.device_profile import REHEARSE_CUDA  # noqa: E402

CUDA_PARTS = ("recipes", "pytest", "throughput", "quickstart")
PARTS = (*CUDA_PARTS, "suite", "encode")
#: Parts that cannot run on the CPU, even rehearsed.
CUDA_ONLY_PARTS = ("pytest",)
#: Seconds each part may take (the defaults keep recipes + pytest + throughput within 9 minutes on one GPU).
PART_LIMITS = {"recipes": 360, "pytest": 90, "throughput": 150, "quickstart": 300, "suite": 600, "encode": 240}
#: The paper experiments and their architecture family; the supervised ones train on SICK triplets here.
RECIPES = {"promptbert_unsup": "bert", "promptbert_unsup_roberta": "roberta", "promptbert_sup": "bert",
           "promptbert_sup_roberta": "roberta", "optiprompt": "bert", "optiprompt_roberta": "roberta",
           "prompteol_sup": "llama"}
RECIPE_STEPS, REHEARSAL_STEPS = 20, 2
#: Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by device-name fragment; the first match is used.
DENSE_BF16_PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0),
                          ("A10G", 70.0), ("L4", 121.0), ("4090", 165.0))
EPOCH_SENTENCES = 1_000_000


def dense_bf16_peak(device_name: str) -> float | None:
    return next((peak for fragment, peak in DENSE_BF16_PEAK_TFLOPS if fragment in device_name), None)


def run(command: list[str], timeout: float, env: dict | None = None) -> dict:
    """A subprocess's exit code, wall time and last lines."""
    started = time.perf_counter()
    if timeout <= 0:
        return {"command": " ".join(command), "exit_code": None, "wall_s": 0.0, "tail": ["not started: the part's time "
                                                                                          "limit was spent"]}
    try:
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **(env or {})})
        code, tail = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    except subprocess.TimeoutExpired:
        code, tail = None, [f"timed out after {timeout:.0f} s"]
    return {"command": " ".join(command), "exit_code": code, "wall_s": round(time.perf_counter() - started, 1),
            "tail": tail}


def save_random_bert_base(directory: Path) -> Path:
    """bert-base (BertConfig()'s defaults: 12 x 768) randomly initialised, with MiniLM's uncased 30522-token
    vocabulary: what the published recipes train, without downloading it."""
    return save_family("bert", directory, Path("."))


def data_root_of(data_root: str | None) -> Path:
    from promptemb.data.root import resolve_data_root

    return resolve_data_root(data_root)


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


def recipes(work: Path, data_root: str | None, limit: float, rehearse: bool) -> dict:
    """Each paper experiment's GPU command on a random model of its family (see the module docstring)."""
    deadline = time.perf_counter() + limit
    steps = REHEARSAL_STEPS if rehearse else RECIPE_STEPS
    models: dict[str, Path] = {}
    results = {}
    for name, family in RECIPES.items():
        if family not in models:
            models[family] = save_family(family, work / f"{family}_random", data_root_of(data_root), tiny=rehearse)
        out = work / "recipes" / name
        record = run(recipe_command(name, models[family], out, steps, data_root, rehearse),
                     deadline - time.perf_counter())
        timer = out / "timer.json"
        if timer.is_file():
            record["result"] = json.loads(timer.read_text())
        results[name] = record
    return {"steps": steps, "models": {family: ("tiny " if rehearse else "") + family for family in models},
            "runs": results}


def throughput(work: Path, data_root: str | None, steps: int, limit: float, rehearse: bool) -> dict:
    deadline = time.perf_counter() + limit
    model = save_family("bert", work / "bert_base_random", data_root_of(data_root), tiny=rehearse)
    peak = None if rehearse else dense_bf16_peak(torch.cuda.get_device_name(0))
    common = [f"backbone.name_or_path={model}", "trainer.precision=bf16-mixed", "data.num_workers=0",
              *([f"data_root={data_root}"] if data_root else [])]
    unsup_data = ["data.download=null", f"data.files=[{WIKI_SAMPLE}]"]
    batches = (8,) if rehearse else (64, 256)
    runs = {f"promptbert_unsup_b{batch}": ["experiment=promptbert_unsup", f"data.batch_size={batch}", *unsup_data]
            for batch in batches}
    sup_batch = 8 if rehearse else 128
    runs[f"promptbert_sup_b{sup_batch}"] = ["experiment=promptbert_sup", "data=sick_triplets",
                                            f"data.batch_size={sup_batch}"]
    results = {}
    for name, overrides in runs.items():
        out = work / f"{name}.json"
        record = run([sys.executable, "bench/train_throughput.py", *overrides, *common, "--steps", str(steps),
                      "--warmup", "1" if rehearse else "3", *(["--device", "cpu"] if rehearse else []),
                      *(["--peak-tflops", str(peak)] if peak else []), "--out", str(out)],
                     deadline - time.perf_counter())
        if out.is_file():
            measured = json.loads(out.read_text())
            record["result"] = measured
            sentences_per_s = measured.get("sentences_per_s")
            if sentences_per_s:
                record["projected_epoch_1M_sentences_min"] = round(EPOCH_SENTENCES / sentences_per_s / 60, 2)
        results[name] = record
    return {"dense_bf16_peak_tflops": peak, "runs": results}


def quickstart(work: Path, data_root: str | None, limit: float, rehearse: bool) -> dict:
    from omegaconf import OmegaConf

    log_dir = work / "quickstart_logs"
    short = ["trainer.max_steps=2", "eval_every_n_steps=2", "callbacks.sts_evaluation.final_tasks=[STSBenchmark]"]
    record = run([sys.executable, "train.py", "experiment=quickstart_unsup", "trainer=gpu", f"paths.log_dir={log_dir}",
                  *(short if rehearse else []), *([f"data_root={data_root}"] if data_root else [])], limit)
    curves = sorted(log_dir.glob("*/runs/*/curve.json"))
    if curves:
        record["gpu_curve"] = json.loads(curves[-1].read_text())["points"]
    pinned = OmegaConf.load(REPO / "configs/experiment/quickstart_unsup.yaml").get("expected_scores")
    record["cpu_pinned"] = OmegaConf.to_container(pinned) if pinned is not None else None
    results = sorted(log_dir.glob("*/runs/*/results.json"))
    if results:
        record["gpu_final_scores"] = json.loads(results[-1].read_text())["scores"]
    return record


def suite(work: Path, data_root: str | None, tasks: str, limit: float) -> dict:
    """The evaluation suite in one evaluate.py process (bench/evaluation_suite.py): wall time, its split (start-up,
    encoding, classifiers, k-means, STS scoring), sentences/s and every score, for the CPU's pinned tables."""
    figures = work / "suite.json"
    record = run([sys.executable, str(REPO / "bench" / "evaluation_suite.py"), "--model", str(MINILM), "--tasks", tasks,
                  "--output", str(figures), *([f"data_root={data_root}"] if data_root else [])], limit)
    if figures.is_file():
        record["result"] = json.loads(figures.read_text())
    return record


def encode(data_root: str | None, limit: float) -> dict:
    """Encoding throughput against `SentenceTransformer.encode`, both with their defaults, on this device
    (bench/encode_throughput.py: the goal line and the embeddings' agreement are in the tail)."""
    return run([sys.executable, str(REPO / "bench" / "encode_throughput.py"), "--model", str(MINILM), "--sentences",
                "20000", "--repeats", "2", "--no-compile", *(["--data-root", data_root] if data_root else [])], limit)


def pytest_gpu(limit: float) -> dict:
    return run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gpu",
                "tests/training/test_gpu_cuda.py"], limit)


def markdown(report: dict) -> str:
    lines = [f"# GPU validation: {report['device']}", "",
             f"torch {report['torch']}, CUDA {report['cuda']}, {report['started']}", ""]
    for part, result in report["parts"].items():
        lines.append(f"## {part}")
        if "refused" in result:
            lines += ["", f"refused: {result['refused']}", ""]
            continue
        records = result.get("runs", {part: result})
        if part == "recipes":
            models = ", ".join(result["models"].values())
            lines += ["", f"{result['steps']} optimiser steps each ({models} at random init)", "",
                      "| experiment | exit | steps/s (real loop) | median step s | peak memory GiB | wall s |",
                      "|---|---:|---:|---:|---:|---:|"]
            for name, record in records.items():
                timed = record.get("result") or {}
                lines.append(f"| {name} | {record.get('exit_code')} | {timed.get('steps_per_s')} | "
                             f"{timed.get('median_step_s')} | {timed.get('peak_memory_gib')} | "
                             f"{record.get('wall_s')} |")
        for name, record in records.items():
            lines += ["", f"### {name}" if len(records) > 1 else "", "", f"`{record.get('command', '')}`", "",
                      f"exit code {record.get('exit_code')}, {record.get('wall_s')} s"]
            measured = record.get("result")
            if measured:
                lines.append("")
                lines += [f"- {key}: {value}" for key, value in measured.items() if not isinstance(value, dict | list)]
            if record.get("projected_epoch_1M_sentences_min") is not None:
                lines.append(f"- projected epoch of 1M sentences: {record['projected_epoch_1M_sentences_min']} min")
            if record.get("gpu_curve") is not None:
                lines.append(f"- GPU dev curve: {record['gpu_curve']}")
                lines.append(f"- CPU pinned values: {record.get('cpu_pinned')}")
            lines += ["", "```", *record.get("tail", [])[-8:], "```", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "logs" / "gpu_validation")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--suite-tasks", default="sts,transfer,clustering")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per throughput run")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--rehearse", action="store_true",
                        help="run the CUDA parts on the CPU with the CUDA device profile, tiny models and 2 steps")
    for part, seconds in PART_LIMITS.items():
        parser.add_argument(f"--{part}-limit", type=float, default=seconds, help=f"seconds for {part} (all its runs)")
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        print(f"error: unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if args.rehearse and cuda:
        print("error: --rehearse runs the CUDA parts on a machine without CUDA; this one has a GPU: drop --rehearse",
              file=sys.stderr)
        return 2
    refused = [part for part in parts if part in CUDA_PARTS and not cuda
               and (not args.rehearse or part in CUDA_ONLY_PARTS)]
    if refused:
        verb = "needs" if len(refused) == 1 else "need"
        rest = "running the rest" if len(refused) < len(parts) else "nothing else to run"
        how = "cannot be rehearsed on the CPU" if args.rehearse else (
            "a CUDA GPU and this machine has none (torch.cuda.is_available() is False; --rehearse runs the others "
            "on the CPU)")
        print(f"error: {', '.join(refused)} {'' if args.rehearse else verb + ' '}{how}; {rest}", file=sys.stderr)
        if len(refused) == len(parts):
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if cuda else "CPU (no CUDA)"
    report = {"device": device + (", rehearsing the CUDA profile" if args.rehearse else ""),
              "torch": torch.__version__, "cuda": torch.version.cuda, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "rehearsal": args.rehearse, "parts": {}}
    steps = REHEARSAL_STEPS if args.rehearse else args.steps
    # every train.py the parts start rehearses the CUDA profile; the caller's environment comes back afterwards
    rehearsal = patch.dict(os.environ, {REHEARSE_CUDA: "1"} if args.rehearse else {})
    with rehearsal, tempfile.TemporaryDirectory(prefix="gpu-validation-") as scratch:
        work = Path(scratch)
        for part in parts:
            limit = getattr(args, f"{part}_limit")
            if part in refused:
                report["parts"][part] = {"refused": "needs a CUDA GPU; this machine has none"}
            elif part == "recipes":
                report["parts"][part] = recipes(work, args.data_root, limit, args.rehearse)
            elif part == "pytest":
                report["parts"][part] = pytest_gpu(limit)
            elif part == "throughput":
                report["parts"][part] = throughput(work, args.data_root, steps, limit, args.rehearse)
            elif part == "quickstart":
                report["parts"][part] = quickstart(work, args.data_root, limit, args.rehearse)
            elif part == "suite":
                report["parts"][part] = suite(work, args.data_root, args.suite_tasks, limit)
            else:
                report["parts"][part] = encode(args.data_root, limit)
    (args.out / "gpu_validation.json").write_text(json.dumps(report, indent=1))
    (args.out / "gpu_validation.md").write_text(markdown(report))
    print(f"wrote {args.out / 'gpu_validation.json'} and {args.out / 'gpu_validation.md'}")
    failed = failed_runs(report)
    if failed:
        print(f"error: {', '.join(failed)} did not run to completion (exit codes in the report)", file=sys.stderr)
        return 1
    return 0


def failed_runs(report: dict) -> list[str]:
    """The parts (recipes, throughput: their runs) that ran and did not exit 0; a refused part is not one."""
    failed = []
    for part, result in report["parts"].items():
        for name, record in result.get("runs", {part: result}).items():
            if "refused" not in record and record.get("exit_code") != 0:
                failed.append(name)
    return failed


if __name__ == "__main__":
    sys.exit(main())
