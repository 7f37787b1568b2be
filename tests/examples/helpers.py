"""Running the examples as their users do: the example file copied into a directory of the user's outside the
package, evaluate.py run from there by its path."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from promptemb.evaluation.families import FAMILIES
from promptemb.poolers import POOLERS
from tests.conftest import REPO

EXAMPLES = REPO / "examples"


@contextmanager
def example_imported(name: str) -> Iterator:
    """The example module imported in this process under its own name, as `imports=[name]` imports it; what it
    registered is gone again afterwards, so other tests of the process see the built-ins only."""
    saved = [(registry, dict(registry._values), dict(registry._owners)) for registry in (POOLERS, FAMILIES)]
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop(name, None)
        for registry, values, owners in saved:
            registry._values, registry._owners = values, owners


def user_directory(tmp_path: Path, *examples: str) -> Path:
    """A fresh directory holding copies of the example files, nothing else of the repository."""
    directory = tmp_path / "user"
    directory.mkdir()
    for name in examples:
        shutil.copy(EXAMPLES / name, directory / name)
    return directory


def evaluate_from(directory: Path, *overrides: str, data_root: Path | None = None) -> subprocess.CompletedProcess:
    """`python /path/to/evaluate.py OVERRIDES` with `directory` as the current directory."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PROMPTEMB_DATA", None)
    env.pop("PYTHONPATH", None)  # nothing of the repository on the path but the installed package
    if data_root is not None:
        env["PROMPTEMB_DATA"] = str(data_root)
    return subprocess.run([sys.executable, str(REPO / "evaluate.py"), "progress=false", *overrides], cwd=directory,
                          env=env, capture_output=True, text=True, timeout=300)
