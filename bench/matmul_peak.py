"""The matmul peak this device reaches: square GEMMs timed for a few seconds, in TFLOP/s.

    python bench/matmul_peak.py [--size 8192] [--dtype bfloat16] [--seconds 3] [--out FILE.json]

bench/gpu_validation.py measures it in the same call as the training runs, so their MFU can be read against what the
device delivers as well as against its data-sheet peak. On CUDA: `--size`³ products in `--dtype` (default bf16),
timed with CUDA events after a warm-up, the best of several rounds; on a CPU (the rehearsal) the same with float32 at
a small size. 2·n³ FLOPs per product.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def measure(size: int, dtype: torch.dtype, seconds: float, device: torch.device) -> dict:
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    flops = 2 * size**3
    torch.matmul(a, b)  # warm-up: kernel selection, workspace allocation
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    best, rounds, spent = float("inf"), 0, 0.0
    per_round = 10 if cuda else 1
    while spent < seconds or rounds < 3:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_round):
                torch.matmul(a, b)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            started = time.perf_counter()
            for _ in range(per_round):
                torch.matmul(a, b)
            elapsed = time.perf_counter() - started
        best, rounds, spent = min(best, elapsed / per_round), rounds + 1, spent + elapsed
    return {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "size": size,
            "dtype": str(dtype).removeprefix("torch."), "rounds": rounds, "best_s": best,
            "tflops": round(flops / best / 1e12, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=None, help="matrix side (default 8192 on CUDA, 512 on a CPU)")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help="default bfloat16 on CUDA, float32 on a CPU")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    size = args.size or (8192 if cuda else 512)
    dtype = DTYPES[args.dtype or ("bfloat16" if cuda else "float32")]
    result = measure(size, dtype, args.seconds, device)
    print(f"matmul peak: {result['tflops']} TFLOP/s ({result['dtype']}, {size}^3, best of {result['rounds']} rounds "
          f"on {result['device']})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
