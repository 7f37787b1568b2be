"""bench/gpu_validation.py without a GPU: its plan and budget, the report written after every part, time-outs and
stops that take a part's whole process group with them, the refusals, and the plan rehearsed on the CPU (a short
rehearsal here, the full plan under `-m slow`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from bench import gpu_validation
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without CUDA")

#: A command whose child sleeps in the same process group and writes its pid to the file named first.
SPAWNS_A_GRANDCHILD = [sys.executable, "-c", textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(120)
""")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its parent's reaping has ended
        return stat.read().split()[2] != "Z"


def wait_for(path, seconds: float = 30) -> str:
    end = time.time() + seconds
    while time.time() < end:
        if path.is_file() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


def test_the_plan_is_in_order_of_value_and_fits_the_budget():
    assert gpu_validation.PARTS == ("paper_recipe", "matmul_peak", "train_loop", "suite", "encode", "gpu_cpu_scores",
                                    "other_recipes", "pytest_gpu")
    table = gpu_validation.budget_table()
    fixed = sum(limit for _, limit in table if limit is not None)
    assert table[0][0].startswith("setup") and fixed <= gpu_validation.BUDGET == 540
    assert gpu_validation.BUDGET - fixed >= 30  # what the parts without a limit share at least
    assert all(part.minimum <= (part.limit or part.minimum) for part in gpu_validation.PLAN)


def test_the_report_is_on_disk_after_the_first_part_before_the_run_ends(tmp_path, monkeypatch, capsys):
    seen_during_second = {}

    def first(ctx, limit):
        return {"command": "first", "exit_code": 0, "wall_s": 0.1, "tail": []}, "first figure"

    def second(ctx, limit):
        seen_during_second["json"] = json.loads((tmp_path / "gpu_validation.json").read_text())
        seen_during_second["md"] = (tmp_path / "gpu_validation.md").read_text()
        return {"command": "second", "exit_code": 0, "wall_s": 0.1, "tail": []}, "second figure"

    monkeypatch.setitem(gpu_validation.RUNNERS, "suite", first)
    monkeypatch.setitem(gpu_validation.RUNNERS, "encode", second)
    assert gpu_validation.main(["--parts", "suite,encode", "--out", str(tmp_path)]) == 0
    during = seen_during_second["json"]
    assert list(during["parts"]) == ["suite"] and during["parts"]["suite"]["figure"] == "first figure"
    assert "| suite | 100 | ran |" in seen_during_second["md"] and "| encode | 50 | not reached |" in \
        seen_during_second["md"]
    final = json.loads((tmp_path / "gpu_validation.json").read_text())
    assert [final["parts"][name]["status"] for name in ("suite", "encode")] == ["ran", "ran"]
    assert capsys.readouterr().out.splitlines()[:2] == ["suite: first figure", "encode: second figure"]


def test_a_part_past_its_time_limit_loses_its_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    started = time.perf_counter()
    record = gpu_validation.run([*SPAWNS_A_GRANDCHILD, pid_file], timeout=3)
    assert time.perf_counter() - started < 20
    assert record["exit_code"] is None and record["tail"][-1].startswith("timed out after 3 s")
    grandchild = int(pid_file.read_text())
    time.sleep(0.5)
    assert not alive(grandchild)


def test_a_stopped_validation_kills_the_running_part_and_keeps_the_finished_ones(tmp_path):
    """SIGTERM (the caller's own limit) while a part runs: that part's process group goes, the report holds every
    part that finished before."""
    pid_file = tmp_path / "grandchild.pid"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from bench import gpu_validation as gv
        gv.RUNNERS["suite"] = lambda ctx, limit: ({{"command": "x", "exit_code": 0, "wall_s": 0, "tail": []}}, "done")
        gv.RUNNERS["encode"] = lambda ctx, limit: (gv.run({SPAWNS_A_GRANDCHILD!r} + [{str(pid_file)!r}], 120), "?")
        sys.exit(gv.main(["--parts", "suite,encode", "--out", {str(tmp_path / "report")!r}]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    grandchild = int(wait_for(pid_file, 60))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    time.sleep(0.5)
    assert not alive(grandchild)
    report = json.loads((tmp_path / "report" / "gpu_validation.json").read_text())
    assert list(report["parts"]) == ["suite"] and out.splitlines()[0] == "suite: done"


def test_a_part_with_too_little_time_left_is_skipped_and_said_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(gpu_validation.RUNNERS, "suite", lambda ctx, limit: pytest.fail("ran"))
    assert gpu_validation.main(["--parts", "suite", "--out", str(tmp_path), "--deadline", str(time.time() + 20)]) == 0
    part = json.loads((tmp_path / "gpu_validation.json").read_text())["parts"]["suite"]
    assert part["status"] == "skipped" and part["figure"].startswith("skipped: 1")
    assert capsys.readouterr().out.startswith("suite: skipped: ")


def test_the_cuda_parts_are_refused_in_one_line_without_cuda(tmp_path):
    proc = subprocess.run([sys.executable, "bench/gpu_validation.py", "--parts", "paper_recipe,train_loop",
                           "--out", str(tmp_path / "report")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: paper_recipe, train_loop need a CUDA GPU and this machine has none (torch.cuda.is_available() is "
        "False; --rehearse runs the others on the CPU); nothing else to run"]
    assert not (tmp_path / "report").exists()  # refused before any work
    proc = subprocess.run([sys.executable, "bench/gpu_validation.py", "--rehearse", "--parts", "pytest_gpu",
                           "--out", str(tmp_path / "report")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: pytest_gpu cannot be rehearsed on the CPU; nothing else to run"]
    proc = subprocess.run([sys.executable, "bench/gpu_validation.py", "--parts", "suite,nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: unknown part(s) nope; valid: {', '.join(gpu_validation.PARTS)}"]
    assert not (tmp_path / "report").exists()


def test_a_part_that_ran_and_failed_makes_the_exit_code_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(gpu_validation.RUNNERS, "suite", lambda ctx, limit: (
        {"command": "python evaluate.py ...", "exit_code": 2, "wall_s": 1.5, "tail": ["error: ..."]}, "exit 2"))
    assert gpu_validation.main(["--parts", "suite", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: suite did not run to completion (exit codes in the report)")


def test_the_dense_bf16_peaks():
    assert gpu_validation.dense_bf16_peak("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_validation.dense_bf16_peak("NVIDIA H100 PCIe") == 756.0
    assert gpu_validation.dense_bf16_peak("NVIDIA H200") == 989.0
    assert gpu_validation.dense_bf16_peak("Some GPU") is None


def rehearse(tmp_path, data_root, *parts: str, timeout: int = 3000) -> tuple[dict, list[str]]:
    env = {**os.environ, "PROMPTEMB_DATA": str(data_root), "HF_HUB_OFFLINE": "1"}
    env.pop("PROMPTEMB_REHEARSE_CUDA", None)
    proc = subprocess.run([sys.executable, "bench/gpu_validation.py", "--rehearse", "--out", str(tmp_path),
                           *(["--parts", ",".join(parts)] if parts else [])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "gpu_validation.json").read_text()), proc.stdout.splitlines()


def test_a_short_rehearsal_runs_the_paper_recipe_through_its_gpu_command(real_data_root, tmp_path):
    """The paper recipe's `train.py experiment=promptbert_unsup trainer=gpu` with the CUDA device profile on the CPU
    (tiny BERT, 2 steps) and the matmul peak: one stdout line per part, the report with both."""
    report, lines = rehearse(tmp_path, real_data_root, "paper_recipe", "matmul_peak", timeout=900)
    assert report["rehearsal"] and report["device"] == "CPU (no CUDA), rehearsing the CUDA profile"
    recipe = report["parts"]["paper_recipe"]
    assert recipe["exit_code"] == 0 and "experiment=promptbert_unsup trainer=gpu" in recipe["command"]
    timed = recipe["result"]
    assert timed["optimizer_steps"] == timed["timed_steps"] == 2 and timed["steps_per_s"] > 0
    assert timed["steps_per_s"] > timed["loop_steps_per_s"]  # the steps alone, without the dev scorings
    assert report["parts"]["matmul_peak"]["result"]["tflops"] > 0
    lines = [line for line in lines if line.split(":")[0] in gpu_validation.PARTS]
    assert [line.split(":")[0] for line in lines] == ["paper_recipe", "matmul_peak"]
    assert lines[0].startswith("paper_recipe: promptbert_unsup exit 0, 2 steps, ")
    assert "| paper_recipe | 100 | ran |" in (tmp_path / "gpu_validation.md").read_text()


@pytest.mark.slow
def test_the_full_plan_rehearsed_on_the_cpu(real_data_root, tmp_path):
    """Every part but `pytest -m gpu` (refused: it needs CUDA): each run exits 0; the score comparison finds the
    same scores (both sides are this CPU)."""
    report, lines = rehearse(tmp_path, real_data_root)
    # one line per part, in the plan's order (model saving and tokenizer training print lines of their own)
    assert [line.split(":")[0] for line in lines if line.split(":")[0] in gpu_validation.PARTS] == \
        list(gpu_validation.PARTS)
    assert report["parts"]["pytest_gpu"]["status"] == "refused"
    assert gpu_validation.failed_runs(report) == []
    other = report["parts"]["other_recipes"]["runs"]
    assert set(other) == set(gpu_validation.RECIPES) - {"promptbert_unsup"}
    loop = report["parts"]["train_loop"]["runs"]
    assert loop["eager"]["result"]["steps"] == loop["compiled"]["result"]["steps"] == 2
    assert loop["compiled"]["compile_seconds"] > 0
    scores = report["parts"]["gpu_cpu_scores"]["result"]
    assert scores["max_abs_difference"] == 0.0 and set(scores["difference"]) == {"STS16"}
    assert report["parts"]["encode"]["result"]["max_abs_diff_unit_embeddings"] < 1e-5
