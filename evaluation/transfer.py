"""SentEval transfer tasks on frozen embeddings, with SentEval's own classifier and protocol (as SimCSE and
PromptBERT run it: `nhid=0`, Adam, batch 64, tenacity 5, epoch_size 4, max_epoch 200, seed 1111, 10 folds): the
`transfer` evaluation family (`TransferFamily`; its settings `family_args.transfer.*` are `ClassifierConfig`'s).

The classifier is SentEval's `MLP(nhid=0)`: one linear layer + softmax cross-entropy (batch mean), trained with
torch's Adam (lr 1e-3, betas 0.9/0.999, eps 1e-8) whose `weight_decay` is the L2 penalty (on weight and bias). Each
"epoch" is `epoch_size` passes over the training rows, each pass a fresh permutation; after each epoch the accuracy on
the early-stopping rows is measured, the best model kept, and training stops at the first non-improving evaluation
once `tenacity` non-improving ones have been seen (the count is never reset), or after `max_epoch` passes.

To reproduce SentEval's numbers and not just its method, every classifier replays SentEval's random streams: its
initial weights are `nn.Linear(d, C)` right after `torch.manual_seed(seed)`, and its permutations (the 5%
early-stopping hold-out, then one per pass) come from a fresh `numpy.random.RandomState(seed)`, as SentEval re-seeds
the global generators for every classifier it builds. Examples come in SentEval's order (data/labeled_readers.py), so
`StratifiedKFold(shuffle=True, random_state=seed)` draws SentEval's folds.

What differs is speed: all the classifiers of a task (folds x L2 values) train at once as one batched linear model
with a per-model Adam state and per-model early stopping, on embeddings computed once. Classifiers that train on the
same rows with the same seeded stream (the L2 values of one fold) see identical batches, so they share one gathered
batch and one matmul as a single wider model; a group leaves the batch when all its models have stopped. Results
equal the sequential classifier's up to float rounding (summation order, torch's fused Adam kernel).

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

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated

import numpy as np
import torch
from annotated_types import Ge, Gt, Lt
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold

from promptemb.common.bounds import AtLeastOne, Fraction, NonNegative, NonNegativeInt, Positive, Seed
from promptemb.common.device_profile import exact_matmuls
from promptemb.common.errors import DataError
from promptemb.evaluation.labeled_scoring import LabeledFamily, LabeledTask

PROTOCOLS = ("inner_kfold", "kfold", "split")


@dataclass(frozen=True)
class ClassifierConfig:
    """SentEval's classifier settings (the "full" configuration SimCSE/PromptBERT report)."""

    seed: Seed = 1111
    kfold: Annotated[int, Ge(2)] = 10
    batch_size: AtLeastOne = 64
    tenacity: NonNegativeInt = 5
    epoch_size: AtLeastOne = 4
    max_epoch: AtLeastOne = 200
    l2_grid: tuple[NonNegative, ...] = (1e-5, 1e-4, 1e-3, 1e-2)
    validation_split: Annotated[float, Gt(0), Lt(1)] = 0.05
    learning_rate: Positive = 1e-3
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    eps: NonNegative = 1e-8

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
    """Best (by early-stopping accuracy) weights [M, d, C] and biases [M, C] of M probes (on the features' device),
    their best early-stopping accuracies, the number of passes each ran, and the optimiser steps the batched problem
    took (each one step of every live probe: the sequential cost on an accelerator)."""

    weights: torch.Tensor
    biases: torch.Tensor
    dev_accuracy: np.ndarray
    passes: np.ndarray
    steps: int = 0

    def logits(self, features: torch.Tensor, rows: np.ndarray, model: int) -> torch.Tensor:
        return features[torch.as_tensor(rows, device=features.device)] @ self.weights[model] + self.biases[model]

    def accuracy(self, features: torch.Tensor, labels: torch.Tensor, rows: np.ndarray, model: int) -> float:
        predicted = self.logits(features, rows, model).argmax(1)
        return float((predicted == labels[torch.as_tensor(rows, device=labels.device)]).double().mean())

    def predict(self, features: torch.Tensor, rows: np.ndarray, model: int) -> np.ndarray:
        return self.logits(features, rows, model).argmax(1).cpu().numpy()


def initial_linear(dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SentEval's initial weights: `nn.Linear(dim, classes)` built right after `torch.manual_seed(seed)` (the global
    generator's state is restored afterwards)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = torch.nn.Linear(dim, classes)
    return layer.weight.detach().T.contiguous(), layer.bias.detach().clone()


def group_probes(probes: Sequence[Probe]) -> list[list[int]]:
    """Probes that train on the same rows with the same permutation stream see the same batches at every step (they
    differ only in L2 and early-stopping rows): such a group trains as one wider linear model on one gathered batch."""
    groups: dict[tuple, list[int]] = {}
    for m, probe in enumerate(probes):
        _, keys, position, has_gauss, gauss = probe.rng.get_state()
        key = (len(probe.train), probe.train.tobytes(), keys.tobytes(), position, has_gauss, gauss)
        groups.setdefault(key, []).append(m)
    return list(groups.values())


@dataclass
class EarlyStoppingRows:
    """One group's early-stopping rows, laid out once: the union of its members' rows (in the order
    `x[rows] @ W.T` scores them) and, for each (member, row) pair, where the row sits in the union, whose logits
    slice it reads and its label."""

    rows: torch.Tensor  # [U] union of the members' rows
    positions: torch.Tensor  # [E] position in `rows` of each (member, row) pair
    members: torch.Tensor  # [E] slot of the pair's member in the group
    labels: torch.Tensor  # [E]
    sizes: np.ndarray  # [K] early-stopping rows per member

    @classmethod
    def of(cls, members: list[int], probes: Sequence[Probe], labels: torch.Tensor) -> EarlyStoppingRows:
        device = labels.device
        union = np.unique(np.concatenate([probes[m].dev for m in members]))
        devs = [probes[m].dev for m in members]
        flat = np.concatenate(devs)
        slot = np.repeat(np.arange(len(members)), [len(dev) for dev in devs])
        return cls(torch.as_tensor(union, device=device), torch.as_tensor(np.searchsorted(union, flat), device=device),
                   torch.as_tensor(slot, device=device), labels[torch.as_tensor(flat, device=device)],
                   np.array([len(dev) for dev in devs], dtype=np.int64))

    def correct(self, x_all: torch.Tensor, weights: torch.Tensor, classes: int) -> torch.Tensor:
        """[K] correctly predicted early-stopping rows of each member (weights [K*C, d+1], member k = rows
        k*C..(k+1)*C), on the device."""
        logits = (x_all[self.rows] @ weights.T).view(len(self.rows), -1, classes)  # [U, K, C]
        hit = logits[self.positions, self.members].argmax(1) == self.labels
        return torch.zeros(len(self.sizes), dtype=torch.int64, device=hit.device).index_add_(0, self.members,
                                                                                            hit.long())


def fit_probes(features: torch.Tensor, labels: torch.Tensor, classes: int, probes: Sequence[Probe],
               config: ClassifierConfig) -> FittedProbes:
    """Train every probe exactly as SentEval trains one classifier, all at once, on the features' device (see the
    module docstring).

    Layout: probes are grouped (see `group_probes`); group g holds K models side by side as one [K*C, d+1] matrix
    (nn.Linear's [out, in] layout with the bias as a last input column fed by a constant 1, so one Adam update and
    one matmul cover weight and bias; the penalty applies to both, as SentEval's weight decay does). Logits are kept
    class-major ([G, K*C, batch]) so the softmax and the weight gradient run over long contiguous rows. The update is
    torch's fused Adam kernel (SentEval's Adam, weight decay added to the gradient first, as torch's Adam does),
    with a step count per group. A model that has stopped keeps computing inside its group until the whole group
    stops, but is never read again. Each step writes into buffers allocated once per epoch (no allocation, no page
    faults per step), and the host reads from the device once per epoch (the early-stopping counts)."""
    count, dim, device = len(probes), features.shape[1], features.device
    if any(len(p.train) == 0 or len(p.dev) == 0 for p in probes):
        raise DataError("a classifier has no training or no early-stopping rows; the task has too few examples "
                        f"for {config.kfold}-fold cross-validation")
    groups = group_probes(probes)
    width = max(len(members) for members in groups)
    # pad every group to `width` models with copies of its first member (trained, never read)
    padded = np.asarray([members + members[:1] * (width - len(members)) for members in groups], dtype=np.int64)
    w0, b0 = initial_linear(dim, classes, config.seed)
    start = torch.cat([w0.T, b0[:, None]], dim=1).to(device=device, dtype=features.dtype)  # [C, d+1]
    x_all = torch.cat([features, torch.ones(len(features), 1, dtype=features.dtype, device=device)], dim=1)
    stopping = [EarlyStoppingRows.of(members, probes, labels) for members in groups]
    params = start.repeat(len(groups), width, 1)  # [G, K*C, d+1]
    avg, avg_sq = torch.zeros_like(params), torch.zeros_like(params)
    steps = torch.zeros(len(groups), dtype=torch.float32, device=device)  # fused Adam's step-count dtype
    l2 = torch.tensor([probes[m].l2 for m in padded.ravel()], dtype=features.dtype).view(len(groups), width)
    l2 = l2.repeat_interleave(classes, dim=1)[:, :, None].to(device)  # [G, K*C, 1]
    best = start.repeat(count, 1, 1)  # [M, C, d+1]
    best_acc = np.full(count, -1.0)
    misses = np.zeros(count, dtype=np.int64)
    passes = np.zeros(count, dtype=np.int64)
    active = np.ones(count, dtype=bool)
    live_groups = np.arange(len(groups))
    adam = dict(lr=config.learning_rate, beta1=config.betas[0], beta2=config.betas[1], weight_decay=0.0,
                eps=config.eps, amsgrad=False, maximize=False)
    bs = config.batch_size
    nepoch, total_steps = 0, 0
    while len(live_groups) and nepoch <= config.max_epoch:
        sel = torch.as_tensor(live_groups, device=device)
        w, m1, m2, t, decay = params[sel], avg[sel], avg_sq[sel], steps[sel], l2[sel]
        size = len(live_groups)
        views = (w.unbind(0), m1.unbind(0), m2.unbind(0), t.unbind(0))
        rngs = [probes[groups[g][0]].rng for g in live_groups]
        trains = [probes[groups[g][0]].train for g in live_groups]
        # this epoch's step buffers (and views of them): the gathered batch, logits (then their gradient) and the
        # weights' gradient
        x = torch.empty(size * bs, dim + 1, dtype=features.dtype, device=device)
        batch_x = x.view(size, bs, dim + 1)
        batch_x_t = batch_x.transpose(1, 2)
        logits = torch.empty(size, width * classes, bs, dtype=features.dtype, device=device)
        grad_logits = torch.empty_like(logits)
        per_class = (logits.view(size, width, classes, bs), grad_logits.view(size, width, classes, bs))
        grad = torch.empty_like(w)
        grads = grad.unbind(0)
        minus_one = torch.full((size, width, 1, bs), -1.0, dtype=features.dtype, device=device)
        for _ in range(config.epoch_size):
            # one pass: each group's rows in its own permutation; batch j of group k = grid[k, j] (-1 = padding)
            longest = max(len(train) for train in trains)
            grid = np.full((size, -(-longest // bs) * bs), -1, dtype=np.int64)
            for k, (train, rng) in enumerate(zip(trains, rngs)):
                grid[k, : len(train)] = train[rng.permutation(len(train))]
            grid = grid.reshape(size, -1, bs)
            valid = grid >= 0
            batch_sizes = valid.sum(2)
            live_per_step = (batch_sizes > 0).T
            # each row's weight in its batch's mean loss (0 for padding), steps first: [steps, G, 1, 1, bs]
            row_weight = valid.astype(np.float32) / np.maximum(batch_sizes, 1).astype(np.float32)[:, :, None]
            row_weight = torch.from_numpy(row_weight).to(device=device, dtype=features.dtype)
            row_weight = row_weight.transpose(0, 1)[:, :, None, None, :]
            grid = torch.from_numpy(np.ascontiguousarray(grid.clip(min=0).transpose(1, 0, 2))).to(device)
            # per step (views, taken once per pass): rows to gather [G * bs], labels [G, K, 1, bs], row weights
            targets = labels[grid][:, :, None, None, :].expand(-1, -1, width, 1, -1).unbind(0)
            rows = grid.view(grid.shape[0], -1).unbind(0)
            row_weight = row_weight.unbind(0)
            total_steps += grid.shape[0]
            for j in range(grid.shape[0]):
                torch.index_select(x_all, 0, rows[j], out=x)
                torch.bmm(w, batch_x_t, out=logits)
                torch.ops.aten._softmax.out(per_class[0], 2, False, out=per_class[1])
                per_class[1].scatter_add_(2, targets[j], minus_one)
                per_class[1].mul_(row_weight[j])
                torch.mul(decay, w, out=grad)
                grad.baddbmm_(grad_logits, batch_x)
                live = live_per_step[j]
                if live.all():  # all but a pass's last batch or so: no group sits out
                    t += 1
                    torch._fused_adam_(views[0], grads, views[1], views[2], [], views[3], **adam)
                else:  # a group without a batch at this step keeps its weights, moments and step count
                    keep = np.flatnonzero(live)
                    t[torch.as_tensor(keep, device=device)] += 1
                    torch._fused_adam_(*([part[k] for k in keep] for part in (views[0], grads, views[1], views[2])),
                                       [], [views[3][k] for k in keep], **adam)
        nepoch += config.epoch_size
        params[sel], avg[sel], avg_sq[sel], steps[sel] = w, m1, m2, t
        correct = torch.cat([stopping[g].correct(x_all, w[k], classes) for k, g in enumerate(live_groups)]).cpu()
        correct = correct.numpy()
        still, offset = [], 0
        for k, g in enumerate(live_groups):
            members = groups[g]
            accuracy = correct[offset:offset + len(members)] / stopping[g].sizes
            offset += len(members)
            for slot, m in enumerate(members):
                if not active[m]:
                    continue
                passes[m] = nepoch
                if accuracy[slot] > best_acc[m]:
                    best_acc[m] = accuracy[slot]
                    best[m] = w[k, slot * classes:(slot + 1) * classes]
                    continue
                if misses[m] >= config.tenacity:
                    active[m] = False
                misses[m] += 1
            if active[members].any():
                still.append(g)
        live_groups = np.asarray(still, dtype=np.int64)
    return FittedProbes(best[:, :, :dim].transpose(1, 2).contiguous(), best[:, :, dim].contiguous(), best_acc, passes,
                        total_steps)


def _pick(scores: list[float], grid: Sequence[float]) -> float:
    return grid[int(np.argmax(scores))]


def _round(value: float) -> float:
    return round(100 * float(value), 2)


def inner_kfold(features: torch.Tensor, labels: torch.Tensor, classes: int, config: ClassifierConfig) -> dict:
    """Nested cross-validation (SentEval's InnerKFoldClassifier)."""
    y = labels.cpu().numpy()
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
            "l2": chosen, "fold_accuracy": fold_accuracy, "classifiers": len(probes) + len(outer),
            "steps": scan.steps + refit.steps}


def kfold(features: torch.Tensor, labels: torch.Tensor, classes: int, train: np.ndarray, test: np.ndarray,
          config: ClassifierConfig, f1: bool = False) -> dict:
    """Cross-validation on train picks L2, then refit on train and score test (SentEval's KFoldClassifier)."""
    y = labels.cpu().numpy()
    folds = list(StratifiedKFold(config.kfold, shuffle=True, random_state=config.seed).split(train, y[train]))
    probes = [probe_on(train[fold_train], train[fold_test], l2, config)
              for l2 in config.l2_grid for fold_train, fold_test in folds]
    scan = fit_probes(features, labels, classes, probes, config)
    per_l2 = scan.dev_accuracy.reshape(len(config.l2_grid), len(folds)).mean(1)
    scores = [_round(value) for value in per_l2]
    l2 = _pick(scores, config.l2_grid)
    refit = fit_probes(features, labels, classes, [probe_with_holdout(train, l2, config)], config)
    result = {"accuracy": _round(refit.accuracy(features, labels, test, 0)), "dev_accuracy": max(scores), "l2": l2,
              "l2_scan": dict(zip(map(str, config.l2_grid), scores)), "classifiers": len(probes) + 1,
              "steps": scan.steps + refit.steps}
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
            "classifiers": len(probes), "steps": fitted.steps}


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


def evaluate_transfer(data: TransferData, embeddings: np.ndarray, config: ClassifierConfig = ClassifierConfig(),
                      device: torch.device | str | None = None) -> dict:
    """Score one transfer task on `embeddings` (rows indexed by `data`); accuracy x100 (and F1 x100 for MRPC). The
    classifiers train on `device` (None: the CPU), the scoring model's device in evaluate.py, in full float32
    (no TF32)."""
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
    device = torch.device(device or "cpu")
    features = torch.from_numpy(np.ascontiguousarray(np.concatenate(blocks))).to(device)
    target = torch.from_numpy(np.concatenate(labels)).to(device)
    with exact_matmuls():
        if data.protocol == "inner_kfold":
            result = inner_kfold(features, target, data.classes, config)
        elif data.protocol == "kfold":
            result = kfold(features, target, data.classes, offsets["train"], offsets["test"], config, f1=data.f1)
        else:
            result = split(features, target, data.classes, offsets["train"], offsets["dev"], offsets["test"], config)
    return {**result, "examples": {name: len(rows) for name, rows in offsets.items()}}


class TransferFamily(LabeledFamily):
    """SentEval transfer: a linear classifier on frozen embeddings (pair tasks on [|u - v|, u * v]), the L2 penalty
    chosen as the task's `protocol` says; test accuracy x100 (and F1 where the record asks)."""

    name = "transfer"
    title = "SentEval transfer"
    summary = ("frozen embeddings, SentEval's linear classifier (nhid=0, Adam, L2 picked by SentEval's validation per "
               "task, seed 1111), test accuracy x100 (MRPC F1 in results.json)")
    axis_label = "accuracy x100"
    Settings = ClassifierConfig

    def score_task(self, task: LabeledTask, embeddings: np.ndarray) -> dict:
        """The classifiers train on the scoring model's device (`self.device`)."""
        started = time.perf_counter()
        splits = task.splits
        classes = int(max(part["labels"].max() for part in splits.values())) + 1
        data = TransferData(task.spec.record["protocol"], splits, classes, f1=bool(task.spec.record.get("f1")))
        record = evaluate_transfer(data, embeddings, self.settings, device=self.device)
        record["seconds"] = round(time.perf_counter() - started, 2)
        return record

    def describe(self) -> dict:
        return self.settings.describe()
