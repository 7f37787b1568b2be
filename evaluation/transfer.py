"""SentEval transfer tasks on frozen embeddings, with SentEval's own classifier and protocol (as SimCSE and
PromptBERT run it: `nhid=0`, Adam, batch 64, tenacity 5, epoch_size 4, max_epoch 200, seed 1111, 10 folds).

The classifier is SentEval's `MLP(nhid=0)`: one linear layer + softmax cross-entropy (batch mean), trained with
torch's Adam (lr 1e-3, betas 0.9/0.999, eps 1e-8) whose `weight_decay` is the L2 penalty (on weight and bias). Each
"epoch" is `epoch_size` passes over the training rows, each pass a fresh permutation; after each epoch the accuracy on
the early-stopping rows is measured, the best model kept, and training stops at the first non-improving evaluation
once `tenacity` non-improving ones have been seen (the count is never reset), or after `max_epoch` passes.

To reproduce SentEval's numbers and not just its method, every classifier replays SentEval's random streams: its
initial weights are `nn.Linear(d, C)` right after `torch.manual_seed(seed)`, and its permutations (the 5%
early-stopping hold-out, then one per pass) come from a fresh `numpy.random.RandomState(seed)`, as SentEval re-seeds
the global generators for every classifier it builds. Examples come in SentEval's order (see data/labeled.py), so
`StratifiedKFold(shuffle=True, random_state=seed)` draws SentEval's folds.

What differs is speed: all the classifiers of a task (folds x L2 values) train at once as one batched linear model
with a per-model Adam state and per-model early stopping, on embeddings computed once; a model that has stopped
leaves the batch.

L2 selection per protocol (scores rounded to 2 decimals before the argmax, first best wins, as SentEval does):
* inner_kfold (MR CR SUBJ MPQA): outer 10-fold; inside each outer train part the same 10-fold split scores each L2
  (early stopping on the inner test fold itself); refit on the outer train part with 5% held out for early stopping;
  report the mean of the per-fold test accuracies (each rounded to 2 decimals).
* kfold (TREC MRPC): 10-fold CV on train picks the L2 (early stopping on the CV test fold); refit on all train with
  5% held out; test accuracy (MRPC also F1 of class 1).
* split (SST2 SST5 SICK-E): each L2 trained on train with early stopping on dev; the dev accuracy picks; test accuracy
  of that same classifier.
Pair tasks (MRPC, SICK-E) use features [|u - v|, u * v].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold

from common.errors import DataError

PROTOCOLS = ("inner_kfold", "kfold", "split")


@dataclass(frozen=True)
class ClassifierConfig:
    """SentEval's classifier settings (the "full" configuration SimCSE/PromptBERT report)."""

    seed: int = 1111
    kfold: int = 10
    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200
    l2_grid: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2)
    validation_split: float = 0.05
    learning_rate: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def describe(self) -> dict:
        return {"classifier": "SentEval MLP nhid=0 (linear + softmax), Adam, L2 as weight decay", **asdict(self)}


@dataclass
class Probe:
    """One classifier to train: rows of the feature matrix it trains on (in order), rows it early-stops on, its L2
    penalty and its permutation stream (already advanced past the hold-out draw when there was one)."""

    train: np.ndarray
    dev: np.ndarray
    l2: float
    rng: np.random.RandomState


def probe_on(train: np.ndarray, dev: np.ndarray, l2: float, config: ClassifierConfig) -> Probe:
    """A classifier that early-stops on given rows (SentEval's `validation_data`)."""
    return Probe(np.asarray(train), np.asarray(dev), l2, np.random.RandomState(config.seed))


def probe_with_holdout(rows: np.ndarray, l2: float, config: ClassifierConfig) -> Probe:
    """A classifier that holds out `validation_split` of `rows` for early stopping (SentEval's
    `validation_split`): the first draw of its permutation stream picks the hold-out."""
    rng = np.random.RandomState(config.seed)
    permutation = rng.permutation(len(rows))
    cut = int(config.validation_split * len(rows))
    return Probe(np.asarray(rows)[permutation[cut:]], np.asarray(rows)[permutation[:cut]], l2, rng)


@dataclass
class FittedProbes:
    """Best (by early-stopping accuracy) weights [M, d, C] and biases [M, C] of M probes, their best early-stopping
    accuracies and the number of passes each ran."""

    weights: torch.Tensor
    biases: torch.Tensor
    dev_accuracy: np.ndarray
    passes: np.ndarray

    def logits(self, features: torch.Tensor, rows: np.ndarray, model: int) -> torch.Tensor:
        return features[torch.as_tensor(rows)] @ self.weights[model] + self.biases[model]

    def accuracy(self, features: torch.Tensor, labels: torch.Tensor, rows: np.ndarray, model: int) -> float:
        predicted = self.logits(features, rows, model).argmax(1)
        return float((predicted == labels[torch.as_tensor(rows)]).double().mean())

    def predict(self, features: torch.Tensor, rows: np.ndarray, model: int) -> np.ndarray:
        return self.logits(features, rows, model).argmax(1).numpy()


def initial_linear(dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SentEval's initial weights: `nn.Linear(dim, classes)` built right after `torch.manual_seed(seed)` (the global
    generator's state is restored afterwards)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = torch.nn.Linear(dim, classes)
    return layer.weight.detach().T.contiguous(), layer.bias.detach().clone()


def _dev_accuracies(features, labels, weights, biases, devs: list[np.ndarray], chunk: int = 64) -> np.ndarray:
    """Accuracy of each model on its own early-stopping rows."""
    out = np.empty(len(devs))
    for start in range(0, len(devs), chunk):
        stop = min(start + chunk, len(devs))
        rows = np.unique(np.concatenate(devs[start:stop]))
        position = np.full(len(features), -1, dtype=np.int64)
        position[rows] = np.arange(len(rows))
        predicted = (torch.einsum("nd,mdc->mnc", features[torch.as_tensor(rows)], weights[start:stop])
                     + biases[start:stop, None, :]).argmax(2)
        for m in range(start, stop):
            dev = devs[m]
            hits = predicted[m - start, torch.as_tensor(position[dev])] == labels[torch.as_tensor(dev)]
            out[m] = hits.double().sum().item() / len(dev)
    return out


def fit_probes(features: torch.Tensor, labels: torch.Tensor, classes: int, probes: Sequence[Probe],
               config: ClassifierConfig) -> FittedProbes:
    """Train every probe exactly as SentEval trains one classifier, all at once (see the module docstring)."""
    count, dim = len(probes), features.shape[1]
    if any(len(p.train) == 0 or len(p.dev) == 0 for p in probes):
        raise DataError("a classifier has no training or no early-stopping rows; the task has too few examples "
                        f"for {config.kfold}-fold cross-validation")
    w0, b0 = initial_linear(dim, classes, config.seed)
    weights, biases = w0.repeat(count, 1, 1), b0.repeat(count, 1)
    m_w, v_w = torch.zeros_like(weights), torch.zeros_like(weights)
    m_b, v_b = torch.zeros_like(biases), torch.zeros_like(biases)
    steps = torch.zeros(count, dtype=torch.float64)
    l2 = torch.tensor([p.l2 for p in probes], dtype=features.dtype)
    best_w, best_b = weights.clone(), biases.clone()
    best_acc = np.full(count, -1.0)
    misses = np.zeros(count, dtype=np.int64)
    passes = np.zeros(count, dtype=np.int64)
    active = np.arange(count)
    beta1, beta2 = config.betas
    bs = config.batch_size
    nepoch = 0
    while len(active) and nepoch <= config.max_epoch:
        act = torch.as_tensor(active)
        w, b = weights[act], biases[act]
        mw, vw, mb, vb, t = m_w[act], v_w[act], m_b[act], v_b[act], steps[act]
        decay = l2[act]
        for _ in range(config.epoch_size):
            # one pass: each model's rows in its own permutation; batch j of model k = grid[k, j] (-1 = padding)
            longest = max(len(probes[m].train) for m in active)
            grid = np.full((len(active), -(-longest // bs) * bs), -1, dtype=np.int64)
            for k, m in enumerate(active):
                grid[k, : len(probes[m].train)] = probes[m].train[probes[m].rng.permutation(len(probes[m].train))]
            grid = torch.from_numpy(grid.reshape(len(active), -1, bs))
            valid = grid >= 0
            batch_sizes = valid.sum(2)
            grid = grid.clamp(min=0)
            for j in range(grid.shape[1]):
                sizes = batch_sizes[:, j]
                live = sizes > 0
                mask = valid[:, j].to(features.dtype)
                x = features[grid[:, j]]  # [M, bs, d]
                y = labels[grid[:, j]]
                logits = torch.baddbmm(b[:, None, :], x, w)
                grad_logits = torch.softmax(logits, dim=2)
                grad_logits.scatter_add_(2, y[:, :, None], -torch.ones_like(y[:, :, None], dtype=features.dtype))
                grad_logits *= (mask / sizes.clamp(min=1).to(features.dtype)[:, None])[..., None]
                grad_w = torch.bmm(x.transpose(1, 2), grad_logits) + decay[:, None, None] * w
                grad_b = grad_logits.sum(1) + decay[:, None] * b
                every = bool(live.all())  # all but a pass's last batch or so: no model sits out
                t = t + (1.0 if every else live.double())
                # bias corrections in float64, as torch's Adam computes them in Python floats
                step_size = (config.learning_rate / (1 - beta1 ** t)).to(features.dtype)
                bias2_sqrt = (1 - beta2 ** t).sqrt().to(features.dtype)
                if not every:
                    step_size = torch.where(live, step_size, 0.0)
                    bias2_sqrt = torch.where(live, bias2_sqrt, 1.0)
                for param, grad, avg, avg_sq, shape in ((w, grad_w, mw, vw, (-1, 1, 1)), (b, grad_b, mb, vb, (-1, 1))):
                    if every:
                        avg.lerp_(grad, 1 - beta1)
                        avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    else:  # a model without a batch at this step keeps its moments (and takes a zero step)
                        keep = live.view(shape)
                        avg.copy_(torch.where(keep, avg.lerp(grad, 1 - beta1), avg))
                        avg_sq.copy_(torch.where(keep, avg_sq * beta2 + (1 - beta2) * grad * grad, avg_sq))
                    denom = (avg_sq.sqrt() / bias2_sqrt.view(shape)).add_(config.eps)
                    param.sub_(step_size.view(shape) * avg / denom)
        nepoch += config.epoch_size
        accuracy = _dev_accuracies(features, labels, w, b, [probes[m].dev for m in active])
        weights[act], biases[act] = w, b
        m_w[act], v_w[act], m_b[act], v_b[act], steps[act] = mw, vw, mb, vb, t
        still = []
        for k, m in enumerate(active):
            passes[m] = nepoch
            if accuracy[k] > best_acc[m]:
                best_acc[m] = accuracy[k]
                best_w[m], best_b[m] = w[k], b[k]
                still.append(m)
                continue
            if misses[m] < config.tenacity:
                still.append(m)
            misses[m] += 1
        active = np.asarray(still, dtype=np.int64)
    return FittedProbes(best_w, best_b, best_acc, passes)


def _pick(scores: list[float], grid: Sequence[float]) -> float:
    return grid[int(np.argmax(scores))]


def _round(value: float) -> float:
    return round(100 * float(value), 2)


def inner_kfold(features: torch.Tensor, labels: torch.Tensor, classes: int, config: ClassifierConfig) -> dict:
    """Nested cross-validation (SentEval's InnerKFoldClassifier)."""
    y = labels.numpy()
    outer = list(StratifiedKFold(config.kfold, shuffle=True, random_state=config.seed).split(np.zeros(len(y)), y))
    inner_split = StratifiedKFold(config.kfold, shuffle=True, random_state=config.seed)
    probes, layout = [], []
    for fold, (train, _test) in enumerate(outer):
        inner = list(inner_split.split(np.zeros(len(train)), y[train]))
        for l2 in config.l2_grid:
            for inner_train, inner_test in inner:
                probes.append(probe_on(train[inner_train], train[inner_test], l2, config))
                layout.append((fold, l2))
    scan = fit_probes(features, labels, classes, probes, config)
    chosen, dev_scores = [], []
    for fold in range(len(outer)):
        scores = [_round(np.mean([scan.dev_accuracy[i] for i, key in enumerate(layout) if key == (fold, l2)]))
                  for l2 in config.l2_grid]
        chosen.append(_pick(scores, config.l2_grid))
        dev_scores.append(max(scores))
    refit = fit_probes(features, labels, classes,
                       [probe_with_holdout(train, l2, config) for (train, _), l2 in zip(outer, chosen)], config)
    fold_accuracy = [_round(refit.accuracy(features, labels, test, fold)) for fold, (_, test) in enumerate(outer)]
    return {"accuracy": round(float(np.mean(fold_accuracy)), 2), "dev_accuracy": round(float(np.mean(dev_scores)), 2),
            "l2": chosen, "fold_accuracy": fold_accuracy, "classifiers": len(probes) + len(outer)}


def kfold(features: torch.Tensor, labels: torch.Tensor, classes: int, train: np.ndarray, test: np.ndarray,
          config: ClassifierConfig, f1: bool = False) -> dict:
    """Cross-validation on train picks L2, then refit on train and score test (SentEval's KFoldClassifier)."""
    y = labels.numpy()
    folds = list(StratifiedKFold(config.kfold, shuffle=True, random_state=config.seed).split(train, y[train]))
    probes = [probe_on(train[fold_train], train[fold_test], l2, config)
              for l2 in config.l2_grid for fold_train, fold_test in folds]
    scan = fit_probes(features, labels, classes, probes, config)
    per_l2 = scan.dev_accuracy.reshape(len(config.l2_grid), len(folds)).mean(1)
    scores = [_round(value) for value in per_l2]
    l2 = _pick(scores, config.l2_grid)
    refit = fit_probes(features, labels, classes, [probe_with_holdout(train, l2, config)], config)
    result = {"accuracy": _round(refit.accuracy(features, labels, test, 0)), "dev_accuracy": max(scores), "l2": l2,
              "l2_scan": dict(zip(map(str, config.l2_grid), scores)), "classifiers": len(probes) + 1}
    if f1:
        result["f1"] = _round(f1_score(y[test], refit.predict(features, test, 0)))
    return result


def split(features: torch.Tensor, labels: torch.Tensor, classes: int, train: np.ndarray, dev: np.ndarray,
          test: np.ndarray, config: ClassifierConfig) -> dict:
    """Each L2 trained on train, early-stopped and picked on dev; test accuracy (SentEval's SplitClassifier, whose
    final refit is the same seeded run as the picked one, so that classifier is reused)."""
    probes = [probe_on(train, dev, l2, config) for l2 in config.l2_grid]
    fitted = fit_probes(features, labels, classes, probes, config)
    scores = [_round(value) for value in fitted.dev_accuracy]
    best = int(np.argmax(scores))
    return {"accuracy": _round(fitted.accuracy(features, labels, test, best)), "dev_accuracy": max(scores),
            "l2": config.l2_grid[best], "l2_scan": dict(zip(map(str, config.l2_grid), scores)),
            "classifiers": len(probes)}


def pair_features(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """SentEval's pair representation [|u - v|, u * v]."""
    return np.concatenate([np.abs(left - right), left * right], axis=1)


@dataclass
class TransferData:
    """A task's examples as rows of one embedding matrix: per split, the row of each sentence (and of each second
    sentence for pair tasks) and the labels."""

    protocol: str
    splits: dict[str, dict] = field(default_factory=dict)  # name -> {"left": rows, "right": rows | None, "labels"}
    classes: int = 0
    f1: bool = False


def evaluate_transfer(data: TransferData, embeddings: np.ndarray, config: ClassifierConfig = ClassifierConfig()
                      ) -> dict:
    """Score one transfer task on `embeddings` (rows indexed by `data`); accuracy x100 (and F1 x100 for MRPC)."""
    if data.protocol not in PROTOCOLS:
        raise DataError(f"unknown transfer protocol {data.protocol!r}; valid: {', '.join(PROTOCOLS)}")
    embeddings = np.asarray(embeddings, dtype=np.float32)
    blocks, labels, offsets = [], [], {}
    for name, part in data.splits.items():
        left = embeddings[part["left"]]
        block = left if part["right"] is None else pair_features(left, embeddings[part["right"]])
        offsets[name] = np.arange(len(block)) + sum(len(b) for b in blocks)
        blocks.append(block)
        labels.append(np.asarray(part["labels"], dtype=np.int64))
    features = torch.from_numpy(np.ascontiguousarray(np.concatenate(blocks)))
    target = torch.from_numpy(np.concatenate(labels))
    if data.protocol == "inner_kfold":
        result = inner_kfold(features, target, data.classes, config)
    elif data.protocol == "kfold":
        result = kfold(features, target, data.classes, offsets["train"], offsets["test"], config, f1=data.f1)
    else:
        result = split(features, target, data.classes, offsets["train"], offsets["dev"], offsets["test"], config)
    return {**result, "examples": {name: len(rows) for name, rows in offsets.items()}}
