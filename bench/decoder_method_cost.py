"""What each decoder prompt method costs relative to PromptEOL: transformer forwards (full and partial), tokens fed to
the model and wall time, measured with the framework's own `Encoder.embed` on the same sentences.

    python bench/decoder_method_cost.py --model DIR [--sentences 256] [--batch-size 64] [--layers 4]

`--layers` sets the Token Prepending / Contrastive Prompting layers for a small model (their defaults are for
LLaMA-2-7B): TP pools layer L-1 with exit L-1, CP pools layer L-1 and intervenes at block 1. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from promptemb.data.root import resolve_data_root
from promptemb.encoder.model import Encoder
from promptemb.poolers import build_pooler

METHODS = ("prompteol", "pcot", "ke", "metaeol", "echo", "token_prepending", "contrastive_prompting")


def stsb_sentences(count: int) -> list[str]:
    path = resolve_data_root(None) / "downstream/STS/STSBenchmark/sts-test.csv"
    sentences = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        sentences += fields[5:7]
    return sentences[:count]


def measure(encoder: Encoder, sentences: list[str], name: str, args: dict) -> dict:
    """Forward calls, rows and real tokens the transformer saw (a forward pre-hook counts them), and wall time."""
    seen = {"forwards": 0, "rows": 0, "tokens": 0}

    def count(_module, _args, kwargs):
        mask = kwargs.get("attention_mask")
        seen["forwards"] += 1
        seen["rows"] += int(mask.shape[0])
        seen["tokens"] += int(mask.sum())

    handle = encoder.transformer.register_forward_pre_hook(count, with_kwargs=True)
    try:
        start = time.perf_counter()
        encoder.embed(sentences, [build_pooler(name, **args)])
        seconds = time.perf_counter() - start
    finally:
        handle.remove()
    return {**seen, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=None, help="model depth, to scale the TP/CP layer defaults")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a shared CPU: more threads than free cores only add contention
    encoder = Encoder(args.model, device="cpu", batch_size=args.batch_size, progress=False)
    depth = args.layers or encoder.num_layers
    small = {"token_prepending": {"layer": depth - 1, "exit": depth - 1},
             "contrastive_prompting": {"layer": depth - 1, "act_layer": 1}}
    sentences = stsb_sentences(args.sentences)
    encoder.embed(sentences[:8], [build_pooler("prompteol")])  # warm-up
    rows = {name: measure(encoder, sentences, name, small.get(name, {})) for name in METHODS}
    base = rows["prompteol"]
    print(f"{len(sentences)} STS-B test sentences, {encoder.describe()['class']} {encoder.num_layers} layers x "
          f"{encoder.hidden_size}, batch {args.batch_size}, 1 CPU thread\n")
    print("| method | forwards / sentence | tokens / sentence | tokens vs PromptEOL | time vs PromptEOL |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        per_sentence = row["rows"] / len(sentences)
        tokens = row["tokens"] / len(sentences)
        print(f"| {name} | {per_sentence:g} | {tokens:.1f} | {row['tokens'] / base['tokens']:.2f}x | "
              f"{row['seconds'] / base['seconds']:.2f}x |")


if __name__ == "__main__":
    main()
