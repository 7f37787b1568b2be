"""kill -9 during checkpoint writes, with $TMPDIR on another filesystem: every kill must leave a loadable last.ckpt,
and the run that resumes afterwards must leave no partial file anywhere (run folder or $TMPDIR).

A tiny BERT trains with a checkpoint after every step; each round starts (or resumes) the run, waits until a write
of last.ckpt is under way (its temporary file exists), sleeps a random 0-20 ms and SIGKILLs the process. After the
last kill one more resume runs to completion. Prints a table and writes OUT/summary.json (read by
scripts/fault_table.py); OUT defaults to a new folder logs/checkpoint_kill_loop/<time>, and a non-empty OUT is
refused (nothing is deleted).

    .venv/bin/python scripts/checkpoint_kill_loop.py [--kills 10] [--tmp-root /dev/shm] [--out DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from promptemb.common.errors import ConfigError  # noqa: E402
from promptemb.common.io import atomic_write_json  # noqa: E402
from promptemb.common.output_dirs import fresh_output_dir  # noqa: E402
from promptemb.training.checkpointing import PARTIAL_SUFFIX  # noqa: E402
from tests.helpers import save_tiny_bert  # noqa: E402

WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
WRITE_WAIT_S = 300


def train_command(model: Path, run: Path, data_root: str, max_steps: int, resume: bool) -> list[str]:
    command = [sys.executable, str(REPO / "train.py"), "experiment=quickstart_unsup", f"backbone.name_or_path={model}",
               f"data_root={data_root}", f"output_dir={run}", "trainer.accelerator=cpu", "trainer.precision=32-true",
               "data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64", "data.batch_size=4",
               "data.num_workers=0", "trainer.max_epochs=-1",
               # last.ckpt after every step, no dev scoring in between (a monitored checkpoint waits for a score)
               "eval_every_n_steps=100000", "callbacks.model_checkpoint.every_n_train_steps=1",
               "callbacks.model_checkpoint.monitor=null", "callbacks.model_checkpoint.save_top_k=0",
               "callbacks.sts_evaluation.final_tasks=[STSBenchmark]", f"trainer.max_steps={max_steps}",
               "extras.print_config=false"]
    if resume:
        command.append(f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    return command


def partials(folder: Path) -> list[Path]:
    return sorted(folder.glob(f".*{PARTIAL_SUFFIX}")) if folder.is_dir() else []


def saved_step(last: Path) -> int | None:
    """The step of a loadable last.ckpt, None when it cannot be loaded."""
    try:
        return int(torch.load(last, map_location="cpu", weights_only=True)["global_step"])
    except Exception:
        return None


def wait_for(condition, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if condition():
            return True
        time.sleep(0.001)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--tmp-root", default="/dev/shm", help="where $TMPDIR is made (another filesystem)")
    parser.add_argument("--out", default=None, help="default: a new folder logs/checkpoint_kill_loop/<time>")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data_root = os.environ.get("PROMPTEMB_DATA")
    if not data_root:
        print("error: set PROMPTEMB_DATA to the data root", file=sys.stderr)
        return 2
    try:
        out = fresh_output_dir(args.out, "checkpoint_kill_loop").resolve()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    model = save_tiny_bert(out / "model", layers=2, hidden=128)
    run, checkpoints = out / "run", out / "run" / "checkpoints"
    tmpdir = Path(tempfile.mkdtemp(prefix="promptemb-kill-loop.", dir=args.tmp_root))
    env = {**os.environ, "TMPDIR": str(tmpdir), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONUNBUFFERED": "1"}
    different_fs = os.stat(tmpdir).st_dev != os.stat(out).st_dev
    rounds, previous_orphans = [], set()
    for kill in range(1, args.kills + 1):
        last = checkpoints / "last.ckpt"
        before = saved_step(last) if last.exists() else None
        log = (out / f"round{kill}.log").open("w")
        process = subprocess.Popen(train_command(model, run, data_root, 100_000, resume=before is not None),
                                   cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)
        # a first last.ckpt must exist to be found loadable; then let 0-2 more writes finish and kill during the next
        wait_for(last.exists, process, WRITE_WAIT_S)
        writing = False
        for _ in range(rng.randint(1, 3)):
            seen = {p.name for p in partials(checkpoints)}
            writing = wait_for(lambda seen=seen: any(p.name.startswith(".last.ckpt.") and p.name not in seen
                                                     for p in partials(checkpoints)), process, WRITE_WAIT_S)
        time.sleep(rng.uniform(0, 0.02))
        during_write = any(p.name.startswith(".last.ckpt.") for p in partials(checkpoints))
        process.send_signal(signal.SIGKILL)
        process.wait()
        log.close()
        after = saved_step(last)
        left = {p.name for p in partials(checkpoints)}
        rounds.append({"kill": kill, "write_seen": writing, "during_write": during_write, "step_before": before,
                       "loadable": after is not None, "step_after": after,
                       "orphans_left_by_kill": len(left - previous_orphans),
                       "earlier_orphans_removed": not (left & previous_orphans)})
        previous_orphans = left
        print(f"kill {kill:2d}: killed {'during' if during_write else 'right after'} a write of last.ckpt; "
              f"last.ckpt {'loads' if after is not None else 'DOES NOT LOAD'} (step {after}); "
              f"{rounds[-1]['orphans_left_by_kill']} partial file(s) left for the next run to remove", flush=True)
    # the next run on the folder removes the orphans; it runs to completion (one more step)
    final_step = (saved_step(checkpoints / "last.ckpt") or 0) + 1
    with (out / "final.log").open("w") as log:
        final = subprocess.run(train_command(model, run, data_root, final_step, resume=True), cwd=out, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    orphans = [str(p) for p in partials(checkpoints)] + [str(p) for p in tmpdir.rglob("*")]
    summary = {
        "kills": args.kills, "tmpdir": str(tmpdir), "tmpdir_on_another_filesystem": different_fs,
        "killed_during_write": sum(r["during_write"] for r in rounds),
        "loadable_last_ckpt": sum(r["loadable"] for r in rounds),
        "earlier_orphans_removed": sum(r["earlier_orphans_removed"] for r in rounds),
        "final_resume_exit_status": final.returncode, "orphans_after_final_resume": orphans, "rounds": rounds,
    }
    atomic_write_json(out / "summary.json", summary)
    shutil.rmtree(tmpdir, ignore_errors=True)
    print(f"{args.kills} kills ({summary['killed_during_write']} during a write of last.ckpt, $TMPDIR={tmpdir} on "
          f"{'another' if different_fs else 'the same'} filesystem): {summary['loadable_last_ckpt']} loadable "
          f"last.ckpt; final resume exit {final.returncode}; {len(orphans)} orphan file(s)")
    ok = (summary["loadable_last_ckpt"] == args.kills and final.returncode == 0 and not orphans
          and all(r["earlier_orphans_removed"] for r in rounds))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
