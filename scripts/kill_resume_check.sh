#!/usr/bin/env bash
# Exact-resume check on the real quickstart: an uninterrupted quickstart_unsup run, and the same run killed with
# SIGKILL some steps after its step-25 checkpoint and resumed from last.ckpt; prints both dev curves, the STS-B test
# score and whether the final weights are bit-identical.   usage: scripts/kill_resume_check.sh [OUT] [overrides...]
# OUT defaults to a new folder logs/kill-resume/<time>; an existing non-empty OUT is refused (nothing is deleted).
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${1:-logs/kill-resume/$(date -u +%Y-%m-%d_%H-%M-%S)}; shift || true
if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then
    echo "error: output folder $OUT is not empty; name a new folder or leave it out for a fresh one under logs/kill-resume" >&2
    exit 2
fi
"$PY" train.py experiment=quickstart_unsup output_dir="$OUT/uninterrupted" "$@"
"$PY" train.py experiment=quickstart_unsup output_dir="$OUT/killed" "$@" &
pid=$!
until compgen -G "$OUT/killed/checkpoints/step25*.ckpt" >/dev/null; do sleep 1; done
sleep "${KILL_AFTER_S:-15}"
kill -9 "$pid"; wait "$pid" || true
echo "killed ${KILL_AFTER_S:-15} s after the step-25 checkpoint; resuming from last.ckpt"
"$PY" train.py experiment=quickstart_unsup output_dir="$OUT/killed" ckpt_path="$OUT/killed/checkpoints/last.ckpt" "$@"
"$PY" - "$OUT" <<'PY'
import json, sys, torch
from pathlib import Path
out = Path(sys.argv[1])
def summary(run):
    curve = [(p["step"], round(p["mask"], 4)) for p in json.loads((run / "curve.json").read_text())["points"]]
    test = json.loads((run / "results.json").read_text())["scores"]["mask"]["STSBenchmark"]
    weights = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    return curve, test, weights
a, b = summary(out / "uninterrupted"), summary(out / "killed")
print("uninterrupted dev curve:", a[0], "STS-B test [MASK]:", a[1])
print("killed+resumed dev curve:", b[0], "STS-B test [MASK]:", b[1])
same = a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2])
print("final weights bit-identical:", same, "| curves equal:", a[0] == b[0], "| test equal:", a[1] == b[1])
sys.exit(0 if same and a[0] == b[0] and a[1] == b[1] else 1)
PY
