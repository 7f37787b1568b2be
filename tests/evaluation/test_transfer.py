"""The transfer evaluator against plain, one-classifier-at-a-time re-computations on tiny synthetic data."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.model_selection import StratifiedKFold

from promptemb.common.device_profile import matmul_precision, preserved_matmul_precision, set_matmul_precision
from promptemb.common.errors import ConfigError, DataError
from promptemb.evaluation.transfer import (
    ClassifierConfig,
    TransferData,
    evaluate_transfer,
    fit_probes,
    group_probes,
    inner_kfold,
    kfold,
    pair_features,
    probe_on,
    probe_with_holdout,
    split,
)
from tests.helpers import assert_close_scaled

#: A batched probe and a plain nn.Linear, trained in float32 through the same Adam steps on other matmul shapes (the
#: CPU's kernels order the sums): weights and biases equal to PROBE_TOL of each tensor's largest entry (observed at
#: most 1.0e-7: Adam's steps do not amplify it here).
PROBE_TOL = 1e-5
TINY = ClassifierConfig(kfold=3, batch_size=8, tenacity=2, epoch_size=2, max_epoch=8, l2_grid=(1e-4, 1e-1))


def plain_classifier(x: np.ndarray, y: np.ndarray, classes: int, l2: float, config: ClassifierConfig,
                     dev: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[torch.nn.Module, float]:
    """One classifier trained the plain way: seeded nn.Linear, torch Adam with weight_decay, mean cross-entropy,
    fresh permutation per pass from a reseeded numpy stream, early stopping with a never-reset miss count."""
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    model = torch.nn.Linear(x.shape[1], classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=l2)
    if dev is None:
        permutation = np.random.permutation(len(x))
        cut = int(config.validation_split * len(x))
        x, y, dev = x[permutation[cut:]], y[permutation[cut:]], (x[permutation[:cut]], y[permutation[:cut]])
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    dx, dy = torch.from_numpy(dev[0]), torch.from_numpy(dev[1])
    best, best_model, misses, epoch = -1.0, None, 0, 0
    while epoch <= config.max_epoch:
        for _ in range(config.epoch_size):
            permutation = np.random.permutation(len(tx))
            for start in range(0, len(tx), config.batch_size):
                idx = torch.from_numpy(permutation[start:start + config.batch_size])
                loss = torch.nn.functional.cross_entropy(model(tx[idx]), ty[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        epoch += config.epoch_size
        with torch.no_grad():
            accuracy = (model(dx).argmax(1) == dy).double().mean().item()
        if accuracy > best:
            best, best_model = accuracy, copy.deepcopy(model)
        else:
            if misses >= config.tenacity:
                break
            misses += 1
    return best_model, best


def plain_accuracy(model, x, y) -> float:
    with torch.no_grad():
        return (model(torch.from_numpy(x)).argmax(1) == torch.from_numpy(y)).double().mean().item()


def blobs(n: int = 90, dim: int = 6, classes: int = 3, seed: int = 0, noise: float = 1.5):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    centers = rng.normal(size=(classes, dim)) * 2
    return (centers[y] + noise * rng.normal(size=(n, dim))).astype(np.float32), y.astype(np.int64)


def test_batched_probes_equal_plain_classifiers():
    x, y = blobs()
    features, labels = torch.from_numpy(x), torch.from_numpy(y)
    rows = np.arange(len(y))
    probes = [probe_on(rows[:60], rows[60:], 1e-4, TINY), probe_on(rows[10:70], rows[70:], 1e-1, TINY),
              probe_with_holdout(rows[:80], 1e-3, TINY)]
    fitted = fit_probes(features, labels, 3, probes, TINY)
    references = [plain_classifier(x[:60], y[:60], 3, 1e-4, TINY, (x[60:], y[60:])),
                  plain_classifier(x[10:70], y[10:70], 3, 1e-1, TINY, (x[70:], y[70:])),
                  plain_classifier(x[:80], y[:80], 3, 1e-3, TINY)]
    for m, (model, best) in enumerate(references):
        assert fitted.dev_accuracy[m] == pytest.approx(best, abs=1e-12)
        assert_close_scaled(fitted.weights[m], model.weight.detach().T, PROBE_TOL, msg=f"weights {m}")
        assert_close_scaled(fitted.biases[m], model.bias.detach(), PROBE_TOL, msg=f"biases {m}")
    assert set(fitted.passes) <= set(range(TINY.epoch_size, TINY.max_epoch + TINY.epoch_size + 1, TINY.epoch_size))
    # every pass of the batched problem takes as many steps as its longest live group has batches
    batches = np.array([-(-len(p.train) // TINY.batch_size) for p in probes])
    expected = sum(TINY.epoch_size * batches[fitted.passes >= end].max()
                   for end in range(TINY.epoch_size, fitted.passes.max() + 1, TINY.epoch_size))
    assert fitted.steps == expected


def test_probes_sharing_training_rows_train_together_and_equal_plain_classifiers():
    # same training rows and permutation stream, different L2 and early-stopping rows: one group of models that
    # stop at different times; plus a probe alone in its group and a hold-out pair sharing a group
    x, y = blobs(n=120, seed=1, noise=3.0)
    features, labels = torch.from_numpy(x), torch.from_numpy(y)
    rows = np.arange(len(y))
    probes = [probe_on(rows[:70], rows[70:95], 1e-4, TINY), probe_on(rows[:70], rows[95:], 3e-1, TINY),
              probe_on(rows[:70], rows[70:], 1e-2, TINY), probe_on(rows[20:90], rows[90:], 1e-4, TINY),
              probe_with_holdout(rows[:100], 1e-4, TINY), probe_with_holdout(rows[:100], 1e-1, TINY)]
    assert group_probes(probes) == [[0, 1, 2], [3], [4, 5]]
    fitted = fit_probes(features, labels, 3, probes, TINY)
    assert fitted.passes[0] < fitted.passes[1]  # a member stops while its group trains on
    references = [plain_classifier(x[:70], y[:70], 3, 1e-4, TINY, (x[70:95], y[70:95])),
                  plain_classifier(x[:70], y[:70], 3, 3e-1, TINY, (x[95:], y[95:])),
                  plain_classifier(x[:70], y[:70], 3, 1e-2, TINY, (x[70:], y[70:])),
                  plain_classifier(x[20:90], y[20:90], 3, 1e-4, TINY, (x[90:], y[90:])),
                  plain_classifier(x[:100], y[:100], 3, 1e-4, TINY), plain_classifier(x[:100], y[:100], 3, 1e-1, TINY)]
    for m, (model, best) in enumerate(references):
        assert fitted.dev_accuracy[m] == pytest.approx(best, abs=1e-12)
        assert_close_scaled(fitted.weights[m], model.weight.detach().T, PROBE_TOL, msg=f"weights {m}")
        assert_close_scaled(fitted.biases[m], model.bias.detach(), PROBE_TOL, msg=f"biases {m}")


def test_inner_kfold_matches_nested_plain_recomputation():
    x, y = blobs(n=64, classes=2, seed=1)
    config = ClassifierConfig(kfold=2, batch_size=8, tenacity=1, epoch_size=2, max_epoch=6, l2_grid=(1e-4, 3e-1))
    result = inner_kfold(torch.from_numpy(x), torch.from_numpy(y), 2, config)
    outer = StratifiedKFold(config.kfold, shuffle=True, random_state=config.seed)
    chosen, test_scores = [], []
    for train, test in outer.split(x, y):
        scores = []
        for l2 in config.l2_grid:
            inner = StratifiedKFold(config.kfold, shuffle=True, random_state=config.seed).split(x[train], y[train])
            scores.append(round(100 * np.mean([
                plain_classifier(x[train][a], y[train][a], 2, l2, config, (x[train][b], y[train][b]))[1]
                for a, b in inner]), 2))
        l2 = config.l2_grid[int(np.argmax(scores))]
        chosen.append(l2)
        model, _ = plain_classifier(x[train], y[train], 2, l2, config)
        test_scores.append(round(100 * plain_accuracy(model, x[test], y[test]), 2))
    assert result["l2"] == chosen
    assert result["fold_accuracy"] == test_scores
    assert result["accuracy"] == round(float(np.mean(test_scores)), 2)


def test_kfold_and_split_match_plain_recomputation():
    x, y = blobs(n=96, classes=3, seed=2)
    features, labels = torch.from_numpy(x), torch.from_numpy(y)
    train, test = np.arange(66), np.arange(66, 96)
    result = kfold(features, labels, 3, train, test, TINY)
    folds = list(StratifiedKFold(TINY.kfold, shuffle=True, random_state=TINY.seed).split(x[train], y[train]))
    scores = [round(100 * np.mean([plain_classifier(x[a], y[a], 3, l2, TINY, (x[b], y[b]))[1] for a, b in folds]), 2)
              for l2 in TINY.l2_grid]
    l2 = TINY.l2_grid[int(np.argmax(scores))]
    model, _ = plain_classifier(x[train], y[train], 3, l2, TINY)
    assert result["l2"] == l2 and list(result["l2_scan"].values()) == scores
    assert result["accuracy"] == round(100 * plain_accuracy(model, x[test], y[test]), 2)

    train, dev, test = np.arange(50), np.arange(50, 70), np.arange(70, 96)
    result = split(features, labels, 3, train, dev, test, TINY)
    runs = [plain_classifier(x[train], y[train], 3, l2, TINY, (x[dev], y[dev])) for l2 in TINY.l2_grid]
    scores = [round(100 * best, 2) for _, best in runs]
    best = int(np.argmax(scores))
    assert result["l2"] == TINY.l2_grid[best] and result["dev_accuracy"] == max(scores)
    assert result["accuracy"] == round(100 * plain_accuracy(runs[best][0], x[test], y[test]), 2)


def test_pair_features_and_pair_task_rows():
    u = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=np.float32)
    v = np.array([[3.0, 1.0], [0.5, -1.0]], dtype=np.float32)
    np.testing.assert_array_equal(pair_features(u, v), [[2.0, 3.0, 3.0, -2.0], [0.0, 4.0, 0.25, -3.0]])

    x, y = blobs(n=60, classes=2, seed=3)
    embeddings = np.concatenate([x, x[::-1]])  # rows 0..59 = left sentences, 60..119 = right ones
    data = TransferData("split", {"train": {"left": np.arange(40), "right": 60 + np.arange(40), "labels": y[:40]},
                                  "dev": {"left": np.arange(40, 50), "right": 100 + np.arange(10), "labels": y[40:50]},
                                  "test": {"left": np.arange(50, 60), "right": 110 + np.arange(10),
                                           "labels": y[50:]}}, classes=2)
    result = evaluate_transfer(data, embeddings, TINY)
    features = pair_features(embeddings[np.r_[0:60]], embeddings[np.r_[60:100, 100:110, 110:120]])
    expected = split(torch.from_numpy(features), torch.from_numpy(y), 2, np.arange(40), np.arange(40, 50),
                     np.arange(50, 60), TINY)
    assert result["accuracy"] == expected["accuracy"] and result["l2"] == expected["l2"]
    assert result["examples"] == {"train": 40, "dev": 10, "test": 10}


def test_bad_input():
    x, y = blobs(n=20)
    with pytest.raises(DataError, match="unknown transfer protocol"):
        evaluate_transfer(TransferData("loo", {"all": {"left": np.arange(20), "right": None, "labels": y}}, 3), x)
    rows = np.arange(20)
    with pytest.raises(DataError, match="no training or no early-stopping rows"):
        fit_probes(torch.from_numpy(x), torch.from_numpy(y), 3, [probe_on(rows, rows[:0], 1e-3, TINY)], TINY)


def test_binary_reader_keeps_blank_lines_in_senteval_order(tmp_path):
    """A blank line is an example with the empty sentence, as SentEval's loader reads it (`line.split()` per line of
    `splitlines()`), then everything in SentEval's stable (token count, label) order."""
    from promptemb.data.labeled_readers import read_binary

    pos, neg = tmp_path / "x.pos", tmp_path / "x.neg"
    pos.write_bytes(b"good  film\n\nfine\n \ngreat movie !\n")
    neg.write_bytes(b"bad\n\nawful film\n")
    got = read_binary(pos, neg, "latin-1")
    samples = [(line.split(), 1) for line in pos.read_text("latin-1").splitlines()]
    samples += [(line.split(), 0) for line in neg.read_text("latin-1").splitlines()]
    expected = sorted(samples, key=lambda z: (len(z[0]), z[1]))
    assert got.sentences == [" ".join(tokens) for tokens, _ in expected]
    assert got.labels.tolist() == [label for _, label in expected]
    assert got.sentences[:3] == ["", "", ""] and got.labels[:3].tolist() == [0, 1, 1]
    neg.write_bytes(b"\n \n")
    with pytest.raises(DataError, match=r"x\.neg: empty file"):
        read_binary(pos, neg, "latin-1")
    pos.write_bytes(b"\n\n")  # blank lines only: the file named is the one without a sentence
    with pytest.raises(DataError, match=r"x\.pos: empty file"):
        read_binary(pos, neg, "latin-1")


def write_mini_labeled(root, registry_path) -> None:
    """Add a tiny CV transfer task and a tiny clustering task to a mini SentEval registry."""
    import yaml

    from tests.helpers import sha256

    words = ["good", "great", "fine", "nice", "bad", "awful", "poor", "sad"]
    (root / "downstream/MINI").mkdir(parents=True)
    pos = root / "downstream/MINI/mini.pos"
    neg = root / "downstream/MINI/mini.neg"
    pos.write_text("".join(f"a {w} movie number {i}\n" for i in range(12) for w in words[:1 + i % 4]), "latin-1")
    neg.write_text("".join(f"a {words[4 + i % 4]} film number {i}\n" for i in range(12)) + "\n", "latin-1")
    size = len(pos.read_text().splitlines()) + len(neg.read_text().splitlines())
    clu = root / "clustering/mini.txt"
    clu.parent.mkdir(parents=True)
    clu.write_text("".join(f"{1 + i % 2}\t{'cats and dogs' if i % 2 else 'stocks and bonds'} {i}\r\n"
                           for i in range(20)))
    registry = yaml.safe_load(registry_path.read_text())
    registry["tasks"]["MINITR"] = {
        "family": "transfer", "format": "binary", "protocol": "inner_kfold", "split": "cv", "size": size,
        "main_score": "accuracy", "encoding": "latin-1",
        "positive": {"path": "downstream/MINI/mini.pos", "sha256": sha256(pos)},
        "negative": {"path": "downstream/MINI/mini.neg", "sha256": sha256(neg)}}
    registry["tasks"]["MINICL"] = {
        "family": "clustering", "format": "clustering", "split": "all", "size": 20, "classes": 2,
        "main_score": "accuracy", "max_sentence_tokens": 4,
        "file": {"path": "clustering/mini.txt", "sha256": sha256(clu)}}
    registry_path.write_text(yaml.safe_dump(registry, sort_keys=False))


#: The mini transfer and clustering tasks at test scale: two folds, four epochs, two trials.
SMALL_FAMILY_ARGS = ("+family_args.transfer.kfold=2", "+family_args.transfer.max_epoch=4",
                     "+family_args.transfer.l2_grid=[0.001,0.01]", "+family_args.clustering.trials=2",
                     "+family_args.clustering.n_init=2")


def score_every_family(mini_data, model: Path, out: Path, *overrides: str) -> dict:
    """evaluate.py on the mini STS, transfer and clustering tasks (test-scale arguments); its results.json, after
    checking it ran and scored the three families in order."""
    import json

    from tests.evaluation.test_evaluate_cli import evaluate

    root, registry = mini_data
    write_mini_labeled(root, registry)
    proc = evaluate(f"backbone.name_or_path={model}", f"task_registry={registry}", f"output_dir={out}",
                    "tasks=[MINI12,MINITR,MINICL]", *overrides, *SMALL_FAMILY_ARGS, data_root=root)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert list(results["families"]) == ["sts", "transfer", "clustering"]
    return results


def test_evaluate_cli_scores_every_family(mini_data, tiny_bert, tmp_path):
    from promptemb.encoder.model import Encoder
    from promptemb.poolers import build_poolers
    from tests.evaluation.test_evaluate_cli import evaluate

    root, registry = mini_data
    out = tmp_path / "out"
    results = score_every_family(mini_data, tiny_bert, out, "poolers=[mean,cls]", "post=[zscore]")
    assert results["scores"] == results["families"]["sts"]["scores"]
    for family, task in (("transfer", "MINITR"), ("clustering", "MINICL")):
        table = results["families"][family]["scores"]
        assert set(table) == {"mean", "cls", "mean+zscore(T)", "cls+zscore(T)"}
        assert table["mean"]["avg"] == table["mean"][task]
        assert (out / f"results_{family}.png").is_file()
    assert results["provenance"]["tasks"]["MINICL"]["max_sentence_tokens"] == 4
    md = (out / "results.md").read_text()
    assert "## STS" in md and "## SentEval transfer" in md and "## Short-text clustering" in md

    # the transfer score is the library evaluator's on the library encoder's embeddings
    from promptemb.data.tasks import load_registry
    from promptemb.evaluation.transfer import ClassifierConfig, TransferData, evaluate_transfer

    spec = load_registry(registry)["MINITR"]
    split = spec.load_labeled(root)["all"]
    embeddings = Encoder(str(tiny_bert)).embed(split.sentences, build_poolers(["mean"]))["mean"]
    data = TransferData("inner_kfold", {"all": {"left": np.arange(len(split)), "right": None,
                                                "labels": split.labels}}, classes=2)
    expected = evaluate_transfer(data, embeddings, ClassifierConfig(kfold=2, max_epoch=4, l2_grid=(0.001, 0.01)))
    assert results["families"]["transfer"]["details"]["mean"]["MINITR"]["accuracy"] == expected["accuracy"]
    assert results["families"]["transfer"]["details"]["mean"]["MINITR"]["l2"] == expected["l2"]

    bad = evaluate(f"backbone.name_or_path={tiny_bert}", f"task_registry={registry}", f"output_dir={tmp_path / 'x'}",
                   "tasks=[MINITR]", "+family_args.transfer.folds=3", data_root=root)
    assert bad.returncode == 2
    assert ("family_args.transfer.folds is not a key of family_args.transfer (ClassifierConfig); did you mean "
            "family_args.transfer.kfold?") in bad.stderr
    unread = evaluate(f"backbone.name_or_path={tiny_bert}", f"task_registry={registry}",
                      f"output_dir={tmp_path / 'y'}", "tasks=[MINI-B]", "+family_args.transfer.kfold=3", data_root=root)
    assert unread.returncode == 2 and not (tmp_path / "y").exists()
    assert unread.stderr.strip() == ("error: family_args.transfer is read by no task of tasks=[MINI-B] (none is a "
                                     "transfer task): drop it, or add a transfer task")


@pytest.mark.parametrize(("args", "message"), [
    ({"transfer": {"kfold": 1}}, "family_args.transfer.kfold=1: Input should be greater than or equal to 2"),
    ({"transfer": {"kfold": 2.5}}, "family_args.transfer.kfold=2.5: Input should be a valid integer"),
    ({"transfer": {"l2_grid": [0.1, -1.0]}}, "family_args.transfer.l2_grid=[0.1, -1.0]: Input should be greater "
                                             "than or equal to 0"),
    ({"transfer": {"learning_rate": float("nan")}}, "family_args.transfer.learning_rate=nan: Input should be a "
                                                    "finite number"),
    ({"transfer": {"betas": [0.9, 1.5]}}, "family_args.transfer.betas=[0.9, 1.5]: Input should be less than or "
                                          "equal to 1"),
    ({"clustering": {"trials": 0}}, "family_args.clustering.trials=0: Input should be greater than or equal to 1"),
    ({"clustering": {"kmeans": "gpu"}}, "family_args.clustering.kmeans='gpu': Input should be 'auto', 'sklearn' or "
                                        "'device'"),
])
def test_family_settings_are_checked_against_their_types(args, message):
    """A family's settings are typed (bounds included) and checked as every config value is, in one line."""
    from promptemb.evaluation.families import build_families

    with pytest.raises(ConfigError) as refused:
        build_families(args)
    assert str(refused.value) == message
    built = build_families({"transfer": {"kfold": 2, "l2_grid": (0.01,), "learning_rate": 1}})
    assert built["transfer"].settings.l2_grid == (0.01,) and built["transfer"].settings.kfold == 2


def test_transfer_on_a_device_in_full_float32():
    """`evaluate_transfer(device=...)` trains on that device (here the CPU, the code a GPU runs) and gives the
    default's result; the classifiers run with IEEE float32 products (`exact_matmuls`: TF32 and oneDNN's bf16 off)
    and the process's setting comes back."""
    x, y = blobs(n=60, classes=2, seed=4)
    data = TransferData("split", {"train": {"left": np.arange(40), "right": None, "labels": y[:40]},
                                  "dev": {"left": np.arange(40, 50), "right": None, "labels": y[40:50]},
                                  "test": {"left": np.arange(50, 60), "right": None, "labels": y[50:]}}, classes=2)
    seen = []
    original = torch.bmm
    onednn = torch.backends.mkldnn.matmul

    def spy(*args, **kwargs):
        seen.append((matmul_precision(), onednn.fp32_precision))
        return original(*args, **kwargs)

    with preserved_matmul_precision():
        set_matmul_precision("tf32")
        onednn.fp32_precision = "bf16"
        try:
            torch.bmm = spy
            on_device = evaluate_transfer(data, x, TINY, device="cpu")
        finally:
            torch.bmm = original
        assert (matmul_precision(), onednn.fp32_precision) == ("tf32", "bf16")
    assert seen and set(seen) == {("ieee", "ieee")}
    assert on_device == evaluate_transfer(data, x, TINY) and on_device["steps"] > 0


def test_mpnet_runs_through_every_evaluator_family(mini_data, tiny_mpnet, tmp_path):
    """A third architecture (MPNet: `<s>`/`</s>`/`<mask>`) through STS, transfer and clustering with the PromptBERT
    template, its [MASK] pooler reading the `<mask>` position."""
    results = score_every_family(mini_data, tiny_mpnet, tmp_path / "out", "poolers=[mean,mask]",
                                 "template=promptbert_bert")
    for family, task in (("sts", "MINI12"), ("transfer", "MINITR"), ("clustering", "MINICL")):
        table = results["families"][family]["scores"]
        assert set(table) == {"mean", "mask"} and all(np.isfinite(table[p][task]) for p in table), table
    assert results["provenance"]["model"]["class"] == "MPNetModel"


def test_mpnet_mask_pooler_reads_the_mask_position(tiny_mpnet):
    """The [MASK] pooler on MPNet is the last layer's state at `<mask>` (id 30526) of the templated input, checked
    against transformers' own forward of the same text."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from promptemb.encoder.model import Encoder
    from promptemb.encoder.template import Template
    from promptemb.poolers import build_pooler

    prompt = 'This sentence : "[X]" means [MASK] .'
    sentences = ["a man is playing a guitar", "the cat sat"]
    ours = Encoder(str(tiny_mpnet), device="cpu").embed(sentences, [build_pooler("mask")], Template(prompt))["mask"]
    tokenizer, model = AutoTokenizer.from_pretrained(tiny_mpnet), AutoModel.from_pretrained(tiny_mpnet).eval()
    for row, sentence in enumerate(sentences):
        ids = tokenizer(prompt.replace("[X]", sentence).replace("[MASK]", tokenizer.mask_token), return_tensors="pt")
        assert (ids["input_ids"][0] == 30526).sum() == 1
        with torch.no_grad():
            state = model(**ids).last_hidden_state[0, ids["input_ids"][0].tolist().index(30526)]
        assert_close_scaled(torch.as_tensor(np.asarray(ours[row])), state, rtol=1e-5)
