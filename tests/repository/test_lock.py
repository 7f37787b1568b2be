"""The locked install: requirements.lock matches pyproject.toml's dependencies and pins every distribution with its
hashes; a stale lock and `make test-latest` without the package index are refused in one line, before any work."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]


def lock_copy(tmp_path: Path) -> Path:
    """The lock script, pyproject.toml and requirements.lock in a folder of their own."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lock.py", tmp_path / "scripts" / "lock.py")
    for name in ("pyproject.toml", "requirements.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def check(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(folder / "scripts" / "lock.py"), "check"], capture_output=True,
                          text=True, cwd=folder)


def test_the_lock_matches_pyproject_and_pins_everything_with_hashes():
    assert check(ROOT).returncode == 0
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", text, flags=re.MULTILINE)
    names = {name.lower() for name, _ in pins}
    assert {"torch", "transformers", "sentence-transformers", "pytorch-lightning", "hydra-core", "mteb"} <= names
    assert dict((n.lower(), v) for n, v in pins)["torch"].startswith("2.13.0")  # .ci/constraints.txt's CPU wheel
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 4)[4])  # one block per distribution
    assert all("--hash=sha256:" in block for block in blocks if "==" in block)
    assert "file://" not in text and "promptemb" not in text.lower().replace("# (scripts/lock.py", "")


def test_a_stale_lock_is_refused_in_one_line(tmp_path):
    folder = lock_copy(tmp_path)
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"pyyaml>=6.0",', '"pyyaml>=6.0",\n    "rich>=13",'))
    assert_one_line_error(check(folder), r"requirements\.lock was compiled from other dependencies than "
                                         r"pyproject\.toml's; run `make lock`", status=1)


def test_settings_elsewhere_in_pyproject_keep_the_lock_valid(tmp_path):
    folder = lock_copy(tmp_path)
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("line-length = 120", "line-length = 100"))
    assert check(folder).returncode == 0


def test_a_missing_lock_is_refused_in_one_line(tmp_path):
    folder = lock_copy(tmp_path)
    (folder / "requirements.lock").unlink()
    assert_one_line_error(check(folder), r"requirements\.lock is missing; run `make lock`", status=1)


def test_latest_without_the_package_index_is_refused_before_any_venv(tmp_path):
    venv = tmp_path / "venv-latest"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "test_latest.sh")], capture_output=True, text=True,
                          env={**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "LATEST_VENV": str(venv)})
    assert_one_line_error(proc, r"make test-latest needs the package index and http://127\.0\.0\.1:9/simple cannot "
                                r"be reached", venv, status=1)
