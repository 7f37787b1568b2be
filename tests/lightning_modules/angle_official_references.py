"""Reference arrays of the official AnglE losses, made with the official package in a side environment.

    python3 -m venv /work/angle-ref && /work/angle-ref/bin/pip install torch==2.13.0 angle-emb==0.6.1
    /work/angle-ref/bin/python tests/lightning_modules/angle_official_references.py

writes tests/lightning_modules/angle_emb_0.6.1.json: tiny random float32 inputs, and for each case the loss and its
gradient with respect to every input, computed by angle-emb 0.6.1 (PyPI; its `angle_emb/loss.py` and
`angle_emb/angle.py` are byte-identical to SeanLee97/AnglE@5155458cfa6f7fbc7a8a19a66960cd86eadfd534, sha256 recorded
below). The package pins transformers==5.3.0, peft==0.18.1 and bitsandbytes==0.49.2, so it is never installed in the
project's environment: the tests read this file (tests/lightning_modules/test_angle_losses.py).

Cases, in the official code's own layouts:
* pairs with scores (`dataset_format='A'`): embeddings in the collator's zigzag order [t1_0, t2_0, t1_1, t2_1, ...],
  labels [2B, 1] (each pair's score on both of its rows): each term alone (`cosine_loss`, `in_batch_negative_loss`,
  `angle_loss` with 'sum' and 'mean' pooling) and `AngleLoss` with its defaults and with the README's STS-B weights;
  graded STS-like scores (with ties, scores in (0, 1), and batch indices whose products collide) and 0/1 labels;
* triplets (`dataset_format='C'`): rows [q_0, p_0, n_0, q_1, ...] through `AngleLoss` with its defaults, with the
  cosine term on, with `ibn_w=0`, and with 'mean' angle pooling;
* the collator's layout (`AngleDataCollator`, a 12-word tokenizer built here): the order of its rows and labels for
  format A and C batches, and what `filter_duplicate` drops.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import angle_emb
import torch
from angle_emb import AngleDataCollator, AngleLoss
from angle_emb.loss import angle_loss, cosine_loss, in_batch_negative_loss

OUT = Path(__file__).with_name(f"angle_emb_{angle_emb.__version__}.json")
REPOSITORY_COMMIT = "5155458cfa6f7fbc7a8a19a66960cd86eadfd534"
#: the README's STS-B fine-tuning example (`angle.fit(..., loss_kwargs=...)`)
README_STSB_WEIGHTS = {"cosine_w": 1.0, "ibn_w": 1.0, "angle_w": 0.02, "cosine_tau": 20, "ibn_tau": 20,
                       "angle_tau": 20}
#: STS-like scores: ties, values in (0, 1) (truncated to 0 by the in-batch term), integers and fractions
STS_SCORES = [0.0, 3.0, 0.8, 1.0, 1.6, 2.0, 2.5, 3.0, 3.8, 4.0, 0.4, 4.6, 5.0, 5.0, 2.0, 1.0]


def f32(tensor: torch.Tensor) -> list:
    """float32 values as JSON numbers: 9 significant digits give every float32 back exactly."""
    return [f32(row) for row in tensor] if tensor.dim() else float(f"{float(tensor):.9g}")


def value_and_grad(function, *inputs: torch.Tensor) -> dict:
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    loss = function(*leaves)
    loss.backward()
    return {"loss": f32(loss.detach()), "grads": [f32(leaf.grad) for leaf in leaves]}


def pair_case(seed: int, pairs: int, dim: int, scores: list[float]) -> dict:
    generator = torch.Generator().manual_seed(seed)
    outputs = torch.randn(2 * pairs, dim, generator=generator)
    labels = torch.tensor(scores[:pairs], dtype=torch.float32).repeat_interleave(2)[:, None]  # zigzag: both rows
    terms = {
        "cosine_loss": lambda y: cosine_loss(labels, y, 20.0),
        "in_batch_negative_loss": lambda y: in_batch_negative_loss(labels, y, 20.0),
        "angle_loss_sum": lambda y: angle_loss(labels, y, 20.0, pooling_strategy="sum"),
        "angle_loss_mean": lambda y: angle_loss(labels, y, 20.0, pooling_strategy="mean"),
        "AngleLoss_defaults": lambda y: AngleLoss(dataset_format="A")(labels, y),
        "AngleLoss_readme_stsb": lambda y: AngleLoss(dataset_format="A", **README_STSB_WEIGHTS)(labels, y),
        "AngleLoss_tau_5": lambda y: AngleLoss(dataset_format="A", cosine_w=0.5, ibn_w=2.0, angle_w=0.3,
                                               cosine_tau=5.0, ibn_tau=10.0, angle_tau=5.0)(labels, y),
    }
    return {"seed": seed, "outputs": f32(outputs), "labels": f32(labels[:, 0]),
            "results": {name: value_and_grad(function, outputs) for name, function in terms.items()}}


def triplet_case(seed: int, triplets: int, dim: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    outputs = torch.randn(3 * triplets, dim, generator=generator)  # [q_0, p_0, n_0, q_1, ...]
    labels = torch.full((3 * triplets, 1), -1.0)  # the collator's label for formats B and C
    settings = {"AngleLoss_defaults": {}, "AngleLoss_cosine_on": {"cosine_w": 1.0},
                "AngleLoss_ibn_off": {"ibn_w": 0.0}, "AngleLoss_mean_pooling": {"angle_pooling_strategy": "mean"},
                "AngleLoss_other_weights": {"ibn_w": 0.5, "cln_w": 2.0, "angle_w": 1.0, "cosine_w": 0.25,
                                            "ibn_tau": 10.0, "angle_tau": 5.0, "cosine_tau": 40.0}}
    return {"seed": seed, "outputs": f32(outputs),
            "results": {name: value_and_grad(lambda y, kw=kw: AngleLoss(dataset_format="C", **kw)(labels, y), outputs)
                        for name, kw in settings.items()}}


def collator_layout() -> dict:
    """Row order and labels of the official collator on a 12-word vocabulary (tokens are words)."""
    from transformers import BertTokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "d", "e", "f", "g"]
    with tempfile.TemporaryDirectory() as folder:
        vocab = Path(folder) / "vocab.txt"
        vocab.write_text("\n".join(words) + "\n")
        tokenizer = BertTokenizer(vocab=str(vocab))
    assert len(tokenizer) == len(words)
    decode = {i: w for i, w in enumerate(words)}

    def rows(batch) -> list[str]:
        return [" ".join(decode[int(t)] for t in ids if int(t) > 3) for ids in batch["input_ids"]]

    pairs = [{"text1": "a", "text2": "b", "label": 4.6}, {"text1": "c", "text2": "d", "label": 0.5},
             {"text1": "e", "text2": "f", "label": 2.0}]
    triplets = [{"query": "a", "positive": "b", "negative": "c"}, {"query": "d", "positive": "e", "negative": "f"}]
    # an example whose second text repeats an earlier text is dropped whole; its first text stays in the seen set
    duplicates = [{"text1": "a", "text2": "b", "label": 1.0}, {"text1": "c", "text2": "a", "label": 2.0},
                  {"text1": "c", "text2": "d", "label": 3.0}, {"text1": "e", "text2": "f", "label": 4.0}]
    out = {}
    for name, features, keep in [("pairs", pairs, True), ("triplets", triplets, True),
                                 ("duplicates_filtered", duplicates, True), ("duplicates_kept", duplicates, False)]:
        batch = AngleDataCollator(tokenizer, filter_duplicate=keep)(features)
        out[name] = {"rows": rows(batch), "labels": f32(batch["labels"][:, 0])}
    return out


def main() -> None:
    torch.set_num_threads(1)
    package = Path(angle_emb.__file__).parent
    record = {
        "made_by": "tests/lightning_modules/angle_official_references.py",
        "angle_emb": angle_emb.__version__,
        "repository_commit": REPOSITORY_COMMIT,
        "sha256": {name: hashlib.sha256((package / name).read_bytes()).hexdigest() for name in ("loss.py", "angle.py")},
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "dtype": "float32",
        "defaults": {k: v for k, v in vars(AngleLoss()).items() if k != "dataset_format"},
        "readme_stsb_weights": README_STSB_WEIGHTS,
        "pairs": [pair_case(0, 12, 8, STS_SCORES), pair_case(1, 16, 8, STS_SCORES),
                  pair_case(2, 8, 16, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])],
        "triplets": [triplet_case(3, 6, 8), triplet_case(4, 4, 6)],
        "collator": collator_layout(),
    }
    OUT.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
