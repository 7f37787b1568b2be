#!/usr/bin/env bash
# `make test-latest`: the suite on the newest releases of every dependency, in its own venv (.venv-latest, or
# LATEST_VENV), rebuilt each time. torch stays the CPU wheel of .ci/constraints.txt (an unpinned torch would pull
# gigabytes of CUDA builds). Prints the versions it resolved, then ruff and the suite as `make test` runs them.
# Run it before moving the lock (docs/development.md): green here, then `make lock`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PROMPTEMB_DATA=${PROMPTEMB_DATA:-$(cd .. && pwd)/shared/data} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} \
    WANDB_MODE=${WANDB_MODE:-disabled}
venv=${LATEST_VENV:-.venv-latest}
python=${PYTHON:-python3}

# one line when pip's index (PIP_INDEX_URL, pip's configuration, or PyPI) cannot be reached, before anything is built
index=${PIP_INDEX_URL:-$("$python" -m pip config get global.index-url 2>/dev/null || echo https://pypi.org/simple)}
if ! reason=$("$python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/pip/", timeout=20)' \
        "$index" 2>&1); then
    echo "error: make test-latest needs the package index and $index cannot be reached ($(echo "$reason" | tail -n 1 \
        | cut -c1-120)); run it on a machine with network access" >&2
    exit 1
fi
if [[ -e $venv && ! -f $venv/pyvenv.cfg ]]; then
    echo "error: $venv exists and is not a virtual environment; remove it or set LATEST_VENV" >&2; exit 1
fi
log=$(mktemp)
echo "test-latest: building $venv from the newest releases (a few minutes)"
if ! { "$python" -m venv --clear "$venv" && "$venv/bin/pip" install -q --upgrade pip \
        && PYTHONWARNINGS="ignore:Editable installation" "$venv/bin/pip" install -q --upgrade --upgrade-strategy eager \
            -c .ci/constraints.txt -e ".[dev]"; } >"$log" 2>&1; then
    echo "error: the newest releases do not install together: $(grep -v '^WARNING' "$log" | tail -n 1 | cut -c1-200)" >&2
    exit 1
fi
echo "test-latest: resolved (compare with requirements.lock):"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version
for name in ("torch", "transformers", "sentence-transformers", "pytorch-lightning", "hydra-core", "datasets",
             "huggingface-hub", "tokenizers", "numpy", "scipy", "scikit-learn", "pydantic", "peft", "mteb", "optuna"):
    print(f"  {name}=={version(name)}")
PY
"$venv/bin/ruff" check . && "$venv/bin/python" -m pytest -n auto --durations=15
