"""The locked install. `make lock` writes requirements.lock from pyproject.toml with pip-tools (every distribution
pinned, with its sha256 hashes); `make install` runs `check` first and refuses a lock made from other dependencies.

The lock records the sha256 of what it was compiled from: the project's dependencies, the `dev` extra flattened
(what `make install` installs) and the build requirement, so a change to pyproject.toml elsewhere (ruff, pytest
settings) keeps it valid. Standard library only: it runs before any venv exists.

    python scripts/lock.py check              # one line and exit 1 when requirements.lock is stale or missing
    python scripts/lock.py compile PIP_COMPILE  # rewrite requirements.lock (make lock)
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"  # the torch CPU wheel (an unpinned torch pulls CUDA builds)
EXTRA = "dev"
MARK = "# pyproject-dependencies-sha256: "


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


def pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        fail("scripts/lock.py reads pyproject.toml with tomllib (Python >= 3.11); run make with PYTHON=python3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def requirements(project: dict, extra: str = EXTRA) -> list[str]:
    """The dependencies and those of `extra`, the project's own extras (`promptemb[a,b]`) expanded, sorted."""
    name = project["project"]["name"]
    extras = project["project"].get("optional-dependencies", {})
    found: set[str] = set(project["project"].get("dependencies", []))
    found.update(project["build-system"]["requires"])
    pending, seen = [extra], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in extras[current]:
            own = re.fullmatch(rf"{re.escape(name)}\[([^\]]+)\]", requirement.replace(" ", ""))
            if own:
                pending.extend(own.group(1).split(","))
            else:
                found.add(requirement)
    return sorted(found, key=str.lower)


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def check() -> None:
    if not LOCK.exists():
        fail(f"{LOCK.name} is missing; run `make lock` to write it from pyproject.toml")
    expected = digest(requirements(pyproject()))
    recorded = next((line[len(MARK):].strip() for line in LOCK.read_text(encoding="utf-8").splitlines()
                     if line.startswith(MARK)), None)
    if recorded != expected:
        fail(f"{LOCK.name} was compiled from other dependencies than pyproject.toml's; run `make lock` (needs the "
             "package index), then commit both")


def compile_lock(pip_compile: str) -> None:
    lines = requirements(pyproject())
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "requirements.in"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        output = Path(folder) / "requirements.lock"
        command = [pip_compile, "--quiet", "--generate-hashes", "--allow-unsafe", "--strip-extras",
                   "--no-emit-index-url", "--no-emit-find-links", "--no-header", "--annotation-style=line",
                   f"--constraint={CONSTRAINTS}", f"--output-file={output}", str(source)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode:
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            fail(f"pip-compile failed: {last}")
        body = output.read_text(encoding="utf-8").replace(str(source), "requirements.in")
    header = ["# Every distribution `make install` and CI install, pinned with its hashes. Written by `make lock`",
              "# (scripts/lock.py, pip-tools) from pyproject.toml's dependencies and its `dev` extra, torch pinned by",
              f"# .ci/constraints.txt; resolved with Python {sys.version_info.major}.{sys.version_info.minor} "
              f"on {sys.platform}. Do not edit: change pyproject.toml, then `make lock`.",
              MARK + digest(lines)]
    tmp = LOCK.with_suffix(".lock.tmp")
    tmp.write_text("\n".join(header) + "\n" + body, encoding="utf-8")
    os.replace(tmp, LOCK)
    print(f"wrote {LOCK.name}: {sum(1 for line in body.splitlines() if '==' in line)} pinned distributions")


def main(argv: list[str]) -> None:
    if argv[:1] == ["check"] and len(argv) == 1:
        check()
    elif argv[:1] == ["compile"] and len(argv) == 2:
        compile_lock(argv[1])
    else:
        fail("usage: python scripts/lock.py check | compile PIP_COMPILE")


if __name__ == "__main__":
    main(sys.argv[1:])
