"""Shared by the fault-injection tests of runs and run folders: a fast train.py command (no STS evaluation, a
checkpoint every 2 steps), snapshots that prove a folder was left byte-identical, and the one-line-error check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import tree_digest

REPO = Path(__file__).resolve().parents[1]
WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"


def fast_overrides(model: Path, root: Path, out: Path, corpus: Path | str = WIKI_SAMPLE, *extra: str) -> list[str]:
    """4 steps of batch 4 on 24 sentences, checkpoints at steps 2 and 4, no dev evaluation (seconds, not minutes)."""
    return ["experiment=quickstart_unsup", f"backbone.name_or_path={model}", f"data_root={root}",
            f"output_dir={out}", "trainer.accelerator=cpu", "trainer.precision=32-true", "data.batch_size=4",
            "data.download=null", f"data.files=[{corpus}]", "data.max_examples=24", "trainer.max_steps=4",
            "trainer.max_epochs=2", "eval_every_n_steps=2", "optimizer.lr=1e-3", "data.num_workers=0",
            "trainer.log_every_n_steps=1", "callbacks.sts_evaluation=null", "callbacks.model_checkpoint.monitor=null",
            "callbacks.model_checkpoint.filename='step{step}'", *extra]


def train_py(*args: str, cwd: Path = REPO, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """train.py as a user's terminal starts it: Ctrl-C (SIGINT) at its default, even when the test suite itself was
    started in the background of a non-interactive shell, which starts its commands with SIGINT ignored (and Python
    then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file (sha256 of its bytes) and folder under `folder`: equal snapshots = nothing changed."""
    folders = {str(path.relative_to(folder)): "<dir>" for path in Path(folder).rglob("*") if path.is_dir()}
    return {**tree_digest(folder), **folders}

