"""Re-run the fault-injection test modules (tests/*/test_fault_*.py) and write the table of docs/faults.md: per class
of fault, how many faults were injected (test cases) and how many were survived (the test passed: the expected
one-line error or recovery, nothing existing changed, nothing left behind), plus the kill -9 loop's result when it
was run. It is written to a new folder logs/fault_table/<time>/faults.md unless --out names the file (the committed
docs/faults.md is replaced only when named).

    .venv/bin/python scripts/fault_table.py            # the default suite's fault tests (about a minute)
    .venv/bin/python scripts/fault_table.py --slow --out docs/faults.md   # also the slow ones; refresh the doc
    .venv/bin/python scripts/fault_table.py --kill-loop-summary logs/checkpoint_kill_loop/TIME/summary.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from promptemb.common.io import atomic_write_text  # noqa: E402
from promptemb.common.output_dirs import fresh_output_dir  # noqa: E402

#: Test module -> the class of fault it injects.
CLASSES = {
    "exporting/test_fault_export_hash": "Export weights not the ones exported (swapped, truncated, flipped byte, "
                                        "missing, extra)",
    "training/test_fault_cache": "Pre-tokenized cache damaged (truncated, random bytes, zeroed 4 KB, record lost or "
                                 "wrong, file missing; concurrent rebuilders)",
    "training/test_fault_atomic_writes": "Checkpoint writes (TMPDIR elsewhere, disk full / EFBIG / EIO, kill "
                                         "mid-write, orphans, ulimit -f)",
    "training/test_fault_memory": "Out of memory in training (CPU allocator, CUDA)",
    "training/test_fault_values_keys": "Values and keys (nan/inf, misspelt keys and options, keys another mode reads)",
}


def run_tests(slow: bool, report: Path) -> None:
    modules = [str(REPO / "tests" / f"{path}.py") for path in CLASSES]
    marks = ["-m", "slow or not slow"] if slow else []
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *marks, f"--junitxml={report}",
                    *modules], cwd=REPO, check=False)


def count(report: Path) -> dict[str, Counter]:
    """Per module: injected (cases run) and survived (passed)."""
    counts: dict[str, Counter] = {name: Counter() for name in CLASSES}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").removeprefix("tests.").replace(".", "/")
        if module not in counts or case.find("skipped") is not None:
            continue
        counts[module]["injected"] += 1
        if case.find("failure") is None and case.find("error") is None:
            counts[module]["survived"] += 1
    return counts


def kill_loop_row(summary_path: Path) -> tuple[str, Counter] | None:
    """The table row of a kill -9 loop and its counts: a kill is survived when last.ckpt loads after it and the
    next run left no orphan file."""
    if not summary_path.is_file():
        return None
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    survived = summary["loadable_last_ckpt"] if not summary["orphans_after_final_resume"] else 0
    place = "another" if summary["tmpdir_on_another_filesystem"] else "the same"
    row = (f"| kill -9 during writes of last.ckpt (`scripts/checkpoint_kill_loop.py`, $TMPDIR on {place} filesystem; "
           f"{summary['killed_during_write']} of {summary['kills']} kills landed mid-write; "
           f"{len(summary['orphans_after_final_resume'])} orphan files after the next run) "
           f"| {summary['kills']} | {survived} |")
    return row, Counter(injected=summary["kills"], survived=survived)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", action="store_true", help="also run the slow tests and the kill -9 loop")
    parser.add_argument("--out", default=None, help="default: a new file logs/fault_table/<time>/faults.md "
                                                    "(docs/faults.md: refresh the committed table)")
    parser.add_argument("--kill-loop-summary", help="summary.json of an earlier scripts/checkpoint_kill_loop.py run "
                                                   "to put in the table (without --slow)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        run_tests(args.slow, report)
        counts = count(report)
        loop_summary = Path(args.kill_loop_summary or Path(scratch) / "loop" / "summary.json")
        if args.slow:
            subprocess.run([sys.executable, str(REPO / "scripts" / "checkpoint_kill_loop.py"), "--out",
                            str(Path(scratch) / "loop")], cwd=REPO, check=False)
        loop = kill_loop_row(loop_summary)
    lines = ["# Faults injected and survived", "",
             f"Written by `scripts/fault_table.py{' --slow' if args.slow else ''}` on "
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC. A fault is survived when the test passes: the entry "
             "point ends in one `error:` line (exit 2, no traceback) or recovers with one warning line, whatever "
             "existed stays byte-identical and nothing is left behind. Each test module `tests/*/test_fault_*.py` "
             "is one class; re-run this script to refresh the table" + ("" if args.slow else
                                                                         " (`--slow`: end-to-end runs too)") + ".",
             "", "| Class of fault | Injected | Survived |", "|---|---:|---:|"]
    for name, title in CLASSES.items():
        lines.append(f"| {title} (`tests/{name}.py`) | {counts[name]['injected']} | {counts[name]['survived']} |")
    if loop:
        lines.append(loop[0])
        counts["kill_loop"] = loop[1]
    total = sum(c["injected"] for c in counts.values()), sum(c["survived"] for c in counts.values())
    lines += [f"| **all** | **{total[0]}** | **{total[1]}** |", ""]
    out = Path(args.out) if args.out else fresh_output_dir(None, "fault_table") / "faults.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}")
    return 0 if total[0] == total[1] else 1


if __name__ == "__main__":
    sys.exit(main())
