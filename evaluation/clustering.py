"""Short-text clustering as the sentence-representations reference evaluates it (amazon-science, cited by the
extraction study), the `clustering` evaluation family (`ClusteringFamily`; its settings `family_args.clustering.*`
are `ClusteringConfig`'s): `KMeans(n_clusters=#gold labels, random_state=trial, n_init=10)` for trial 0..9 on the frozen
embeddings; accuracy = the best one-to-one matching of clusters to labels (Hungarian algorithm on the confusion
matrix, scipy's `linear_sum_assignment`) x100; NMI (scikit-learn, arithmetic normalisation) x100 alongside. Reported
as mean and sample standard deviation (ddof=1, as the reference's pandas `std`) over the trials.

Speed without changing a result: scikit-learn's k-means++ seeding on float32 data re-converts the whole data set to
float64 (and recomputes its norms) for every candidate center, which made seeding ~80% of the k-means time here.
`kmeans_labels` picks the same seeds with one float64 copy, distance rows computed in blocks and kept, and the same
arithmetic (same random draws, same distance formula, same float32 rounding), then lets scikit-learn's own Lloyd
iterations and best-of-`n_init` rule finish from those seeds; tests check its labels against `KMeans(...).fit_predict`
directly.

Reproducible on any machine: scikit-learn's Lloyd sums its per-thread partial centres in a grouping that depends on
the number of OpenMP threads, so the same k-means run gives different labels on 1 and 2 threads (agnews on MiniLM:
83.51 vs 83.55). Each trial therefore runs its k-means on one thread, and trials run side by side on the machine's
cores: the scores are the one-thread scores whatever the core count. The unit of work is one (trial, initialisation)
pair: the seeds of a trial's ten initialisations come first (they are drawn one after the other from the trial's
random state), then its ten Lloyd runs, and a pool of one thread per core takes the runs of every trial, so all
cores stay busy to the end (ten trials on ten cores would leave a 16-core machine's other six idle).

On an accelerator (the scoring model's device; `ClusteringConfig.kmeans`), the Lloyd runs of all trials and
initialisations run at once as one batched tensor problem (`lloyd_runs`), from the same seeds, with scikit-learn's
arithmetic (float32 data centred on its mean, distances |c|^2 - 2 x.c, float32 centre means, empty clusters
relocated to the farthest points), its stopping rules (labels unchanged, or centre shift within `tol` x the mean
feature variance) and its rule for the best initialisation. It equals scikit-learn up to float rounding: matrix
products sum in another order, so a point almost equidistant from two centres can end in the other one.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score
from sklearn.utils.extmath import row_norms
from threadpoolctl import threadpool_limits

from promptemb.common.bounds import AtLeastOne
from promptemb.common.device_profile import exact_matmuls
from promptemb.common.errors import DataError
from promptemb.evaluation.labeled_scoring import LabeledFamily, LabeledTask

#: where the Lloyd runs happen: `auto` = on the scoring model's device when it is an accelerator, else scikit-learn
#: on the CPU's cores; `sklearn` = scikit-learn always; `device` = the batched torch runs on the model's device
KMeansBackend = Literal["auto", "sklearn", "device"]
MAX_ITER = 300  # scikit-learn's KMeans default
TOL = 1e-4  # scikit-learn's KMeans default, relative to the mean feature variance


@dataclass(frozen=True)
class ClusteringConfig:
    trials: AtLeastOne = 10
    n_init: AtLeastOne = 10
    kmeans: KMeansBackend = "auto"

    def describe(self) -> dict:
        return {"method": "KMeans(n_clusters=#labels, random_state=trial, n_init), Hungarian accuracy", **asdict(self)}

    def backend(self, device: torch.device | str | None) -> str:
        """"sklearn" or "device" for scoring with a model on `device` (None: the CPU)."""
        on_accelerator = device is not None and torch.device(device).type != "cpu"
        if self.kmeans == "auto":
            return "device" if on_accelerator else "sklearn"
        return self.kmeans


def confusion_matrix(predicted: np.ndarray, gold: np.ndarray, size: int) -> np.ndarray:
    """counts[cluster, label]."""
    counts = np.zeros((size, size), dtype=np.int64)
    np.add.at(counts, (predicted, gold), 1)
    return counts


def hungarian_accuracy(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Fraction of examples whose cluster is matched to their label under the best one-to-one cluster-label map."""
    predicted, gold = np.asarray(predicted), np.asarray(gold)
    if predicted.shape != gold.shape or predicted.ndim != 1 or not len(gold):
        raise DataError(f"cluster and label arrays must be 1-D and of the same non-zero length, got "
                        f"{predicted.shape} and {gold.shape}")
    if predicted.min() < 0 or gold.min() < 0:
        raise DataError("cluster ids and labels must be non-negative integers")
    counts = confusion_matrix(predicted, gold, int(max(predicted.max(), gold.max())) + 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / len(gold))


class PlusPlusSeeder:
    """scikit-learn's greedy k-means++ seeding (`_kmeans_plusplus`, 2 + ln k local trials) on mean-centred float32
    data. Distances are computed as scikit-learn computes them for float32 input: in float64 as
    (-2 c.x + |c|^2) + |x|^2, rounded to float32, clipped at 0. Seeds are data points, so a point's distance row is
    the same in every initialisation and trial: rows are computed in blocks of `block_rows` the first time one of
    them is drawn, and kept (up to `cache_bytes`; past that, a draw's rows are computed on their own). One pass over
    the float64 data per block instead of one per draw: the seeding is bound by reading that data, and ten trials of
    ten initialisations end up drawing nearly every point. With `device` (the device k-means), the blocks are
    computed there (the same float64 arithmetic in the same order: equal rows but for the last float64 bits, which
    the rounding to float32 almost always absorbs), the draws stay on the host."""

    def __init__(self, centred: np.ndarray, cache_bytes: int = 1 << 30, block_rows: int = 256,
                 device: torch.device | str | None = None):
        self.x = centred
        self.x64 = centred.astype(np.float64)
        self.norms64 = row_norms(self.x64, squared=True)
        self.weights = np.ones(len(centred), dtype=centred.dtype)
        self.block_rows = block_rows
        self.blocks: dict[int, np.ndarray] = {}  # block number -> float32 [block_rows, n] distance rows
        self.max_blocks = cache_bytes // (4 * len(centred) * block_rows)
        self.on_device = None
        if device is not None:
            self.on_device = (torch.as_tensor(self.x64, device=device), torch.as_tensor(self.norms64, device=device))

    def compute(self, rows: np.ndarray | slice) -> np.ndarray:
        if self.on_device is not None:
            x64, norms64 = self.on_device
            index = rows if isinstance(rows, slice) else torch.as_tensor(rows, device=x64.device)
            with torch.inference_mode():
                d = torch.matmul(x64[index], x64.T).mul_(-2).add_(norms64[index][:, None]).add_(norms64[None, :])
                return d.float().clamp_(min=0).cpu().numpy()
        centres = self.x64[rows]
        d = -2 * (centres @ self.x64.T)
        d += self.norms64[rows][:, None]
        d += self.norms64[None, :]
        return np.maximum(d.astype(np.float32), 0)

    def distances(self, indices: np.ndarray) -> np.ndarray:
        """float32 [len(indices), n]: squared distances from the points `indices` to every point."""
        size = self.block_rows
        missing = [block for block in np.unique(indices // size).tolist() if block not in self.blocks]
        if len(self.blocks) + len(missing) > self.max_blocks:
            return self.compute(indices)
        for block in missing:
            self.blocks[block] = self.compute(slice(block * size, (block + 1) * size))
        return np.stack([self.blocks[i // size][i % size] for i in indices.tolist()])

    def seed(self, k: int, random_state: np.random.RandomState) -> np.ndarray:
        """Indices of the k seed points, drawing from `random_state` exactly as scikit-learn does."""
        n = len(self.x)
        local_trials = 2 + int(np.log(k))
        indices = np.full(k, -1, dtype=int)
        indices[0] = random_state.choice(n, p=self.weights / self.weights.sum())
        closest = self.distances(indices[:1])
        potential = closest @ self.weights
        for c in range(1, k):
            draws = random_state.uniform(size=local_trials) * potential
            candidates = np.searchsorted(np.cumsum(self.weights * closest), draws)
            np.clip(candidates, None, closest.size - 1, out=candidates)
            candidate_distances = np.minimum(closest, self.distances(candidates))
            potentials = candidate_distances @ self.weights.reshape(-1, 1)
            best = np.argmin(potentials)
            potential, closest = potentials[best], candidate_distances[best]
            indices[c] = candidates[best]
        return indices


def seeder_for(x: np.ndarray, device: torch.device | str | None = None) -> PlusPlusSeeder:
    """The seeder for float32 data `x`, centred as scikit-learn's KMeans centres it (its float32 column mean);
    `device`: where its distance rows are computed (None: numpy on the host)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    centred = x.copy()
    centred -= x.mean(axis=0)
    return PlusPlusSeeder(centred, device=device)


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """True when two labelings are the same clustering up to a renaming of the clusters."""
    forward, backward = {}, {}
    for x, y in zip(a.tolist(), b.tolist()):
        if forward.setdefault(x, y) != y or backward.setdefault(y, x) != x:
            return False
    return True


def trial_seeds(seeder: PlusPlusSeeder, k: int, random_state: int, n_init: int) -> list[np.ndarray]:
    """The seed points of `KMeans(random_state=random_state, n_init=n_init)`'s initialisations, in order (all drawn
    from one random state, as scikit-learn draws them)."""
    rng = np.random.RandomState(random_state)
    return [seeder.seed(k, rng) for _ in range(n_init)]


def best_run(runs: list[tuple[np.ndarray, float]]) -> np.ndarray:
    """scikit-learn's rule for the best of `n_init` runs (labels, inertia), in initialisation order: a lower inertia
    and a different clustering replaces the best so far."""
    best_labels, best_inertia = None, None
    for labels, inertia in runs:
        if best_inertia is None or (inertia < best_inertia and not same_partition(labels, best_labels)):
            best_labels, best_inertia = labels, inertia
    return best_labels


def sklearn_lloyd(x: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, float]:
    """scikit-learn's Lloyd run from the data points `seeds` (labels, inertia)."""
    # X[indices] - mean is exactly the centred seed scikit-learn would start from
    run = KMeans(n_clusters=len(seeds), init=x[seeds], n_init=1).fit(x)
    return run.labels_, run.inertia_


def kmeans_labels(x: np.ndarray, k: int, random_state: int, n_init: int, seeder: PlusPlusSeeder | None = None
                  ) -> np.ndarray:
    """The labels of `KMeans(n_clusters=k, random_state=random_state, n_init=n_init).fit_predict(x)` for dense
    float32 `x`: the same seeds per initialisation, scikit-learn's Lloyd run from each, and its rule for the best run
    (lower inertia and a different clustering replaces the best so far). Pass the same `seeder` (built by
    `seeder_for(x)`) to calls on the same data to share its distance rows."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    seeder = seeder or seeder_for(x)
    return best_run([sklearn_lloyd(x, seeds) for seeds in trial_seeds(seeder, k, random_state, n_init)])


def available_cores() -> int:
    return len(os.sched_getaffinity(0))


def kmeans_trials(x: np.ndarray, k: int, config: ClusteringConfig, workers: int | None = None) -> list[np.ndarray]:
    """`kmeans_labels` for random states 0..trials-1 on `workers` threads (default: the cores this process may use),
    each Lloyd run on one OpenMP thread: the labels scikit-learn gives on one thread. Work items are the trials'
    seedings, then every (trial, initialisation) Lloyd run."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    seeder = seeder_for(x)
    workers = workers or available_cores()

    def run(seeds: np.ndarray) -> tuple[np.ndarray, float]:
        # OpenMP's thread count is a per-thread setting: limit it in the thread that runs the k-means
        with threadpool_limits(limits=1, user_api="openmp"):
            return sklearn_lloyd(x, seeds)

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=workers) as pool:
        seeds = list(pool.map(lambda trial: trial_seeds(seeder, k, trial, config.n_init), range(config.trials)))
        runs = list(pool.map(run, [s for trial in seeds for s in trial]))
    return [best_run(runs[t * config.n_init:(t + 1) * config.n_init]) for t in range(config.trials)]


def relocate_empty_clusters(x: np.ndarray, centres_old: np.ndarray, sums: np.ndarray, counts: np.ndarray,
                            labels: np.ndarray) -> None:
    """scikit-learn's `_relocate_empty_clusters_dense` (unit sample weights), in place on the float32 cluster sums
    and counts of one run: each empty cluster takes one of the points farthest from their centre (in
    `np.argpartition`'s order), which leaves its own cluster."""
    empty = np.flatnonzero(counts == 0)
    if not len(empty):
        return
    distances = ((x - centres_old[labels]) ** 2).sum(axis=1)
    if distances.max() == 0:
        return
    far = np.argpartition(distances, -len(empty))[:-len(empty) - 1:-1]
    for cluster, point in zip(empty.tolist(), far.tolist()):
        old = labels[point]
        sums[old] -= x[point]
        sums[cluster] = x[point]
        counts[cluster] = 1
        counts[old] -= 1


def _assign(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """[R, n] index of the nearest centre, by scikit-learn's |c|^2 - 2 x.c (first of equals); one matrix product
    for all R runs ([R*k, d] x [d, n])."""
    norms = (centres * centres).sum(2)  # [R, k]
    return torch.matmul(centres, x.T).mul_(-2).add_(norms[:, :, None]).argmin(1)  # one [R, k, n] temporary


def _cluster_sums(x: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, k, d] sums and [R, k] counts of the points of each cluster (a one-hot product: deterministic on CUDA)."""
    onehot = torch.zeros(len(labels), k, x.shape[0], dtype=x.dtype, device=x.device)
    onehot.scatter_(1, labels[:, None, :], 1.0)
    return torch.matmul(onehot, x), onehot.sum(2)


def lloyd_runs(x: np.ndarray, inits: np.ndarray, device: torch.device | str, tol: float, max_iter: int = MAX_ITER,
               memory_bytes: int = 1 << 30) -> list[tuple[np.ndarray, float]]:
    """scikit-learn's `_kmeans_single_lloyd` for R runs at once on `device`: `x` [n, d] float32 centred data,
    `inits` [R, k, d] centred initial centres; `tol` already scaled (scikit-learn's `_tolerance`). Per run: assign
    each point to its nearest centre; stop when no label changed (strict convergence), else move each centre to
    its points' mean (empty clusters relocated first) and stop once the squared centre shifts sum to <= `tol`
    (then assign once more); at most `max_iter` iterations. Runs that have stopped leave the batch; runs go through
    in chunks whose [runs, n, k] temporaries fit in `memory_bytes`. Returns (labels, inertia) per run."""
    n, k = x.shape[0], inits.shape[1]
    with exact_matmuls(), torch.inference_mode():
        data = torch.as_tensor(x, device=device)
        centres = torch.tensor(inits, dtype=torch.float32, device=device)  # a copy: updated in place below
        labels_old = torch.full((len(inits), n), -1, dtype=torch.int64, device=device)
        strict = np.zeros(len(inits), dtype=bool)
        active = np.arange(len(inits))
        chunk = max(1, memory_bytes // (4 * n * k))
        for _ in range(max_iter):
            parts = [_lloyd_step(data, centres[torch.as_tensor(part, device=device)], k, x)
                     for part in np.array_split(active, -(-len(active) // chunk))]
            labels = torch.cat([part[0] for part in parts])
            moved = torch.cat([part[1] for part in parts])
            shift = torch.cat([part[2] for part in parts])
            index = torch.as_tensor(active, device=device)
            same = (labels == labels_old[index]).all(1)
            centres[index] = moved
            labels_old[index] = labels
            same, shift = same.cpu().numpy(), shift.cpu().numpy()
            strict[active[same]] = True
            active = active[~(same | (shift <= tol))]
            if not len(active):
                break
        # runs that stopped on the shift (or on max_iter): labels of their final centres
        loose = torch.as_tensor(np.flatnonzero(~strict), device=device)
        if len(loose):
            labels_old[loose] = torch.cat([_assign(data, centres[part]) for part in loose.split(chunk)])
        inertia = torch.stack([((data - centres[run][labels_old[run]]).double() ** 2).sum()
                               for run in range(len(inits))]).cpu().tolist()
        labels = labels_old.cpu().numpy()
    return [(labels[run].astype(np.int32), inertia[run]) for run in range(len(inits))]


def _lloyd_step(data: torch.Tensor, centres: torch.Tensor, k: int, x: np.ndarray
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Lloyd iteration of a chunk of runs: labels [R, n], new centres [R, k, d], squared centre shift [R]."""
    labels = _assign(data, centres)
    sums, counts = _cluster_sums(data, labels, k)
    empty = torch.nonzero((counts == 0).any(1)).flatten().tolist()
    for run in empty:  # rare: relocated on the host exactly as scikit-learn does
        s, c = sums[run].cpu().numpy(), counts[run].cpu().numpy()
        relocate_empty_clusters(x, centres[run].cpu().numpy(), s, c, labels[run].cpu().numpy())
        sums[run], counts[run] = torch.as_tensor(s), torch.as_tensor(c)
    alpha = 1.0 / counts  # scikit-learn's reciprocal, then a product (C's double 1.0 / w rounds to the same float)
    moved = sums * alpha[:, :, None]
    if empty and bool((counts == 0).any()):  # only when every point sits on its centre: scikit-learn's
        # `_average_centers` copies the heaviest cluster's centre, averaged already if it comes first, else a sum
        heaviest = counts.argmax(1)[:, None, None].expand(-1, 1, sums.shape[2])
        averaged_already = torch.arange(k, device=counts.device)[None, :, None] > heaviest[:, :, :1]
        source = torch.where(averaged_already, moved.gather(1, heaviest), sums.gather(1, heaviest))
        moved = torch.where(counts[:, :, None] > 0, moved, source)
    shift = ((moved - centres) ** 2).sum(2).sqrt()
    return labels, moved, (shift ** 2).sum(1)


def kmeans_tolerance(x: np.ndarray, tol: float = TOL) -> float:
    """scikit-learn's `_tolerance`: `tol` x the mean per-feature variance of the (uncentred) data."""
    return float(np.mean(np.var(x, axis=0)) * tol)


def device_kmeans_trials(x: np.ndarray, k: int, config: ClusteringConfig, device: torch.device | str,
                         workers: int | None = None) -> list[np.ndarray]:
    """`kmeans_trials` with the Lloyd runs of every trial and initialisation batched on `device` (`lloyd_runs`);
    the seeds are scikit-learn's (drawn on the host, trials side by side on `workers` threads; the seeding's distance
    rows computed on `device`)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    seeder = seeder_for(x, device)
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(workers or available_cores()) as pool:
        seeds = list(pool.map(lambda trial: trial_seeds(seeder, k, trial, config.n_init), range(config.trials)))
    inits = np.stack([seeder.x[s] for trial in seeds for s in trial])  # centred seeds, [trials * n_init, k, d]
    runs = lloyd_runs(seeder.x, inits, device, kmeans_tolerance(x))
    return [best_run(runs[t * config.n_init:(t + 1) * config.n_init]) for t in range(config.trials)]


def evaluate_clustering(embeddings: np.ndarray, labels: np.ndarray, config: ClusteringConfig = ClusteringConfig(),
                        workers: int | None = None, device: torch.device | str | None = None) -> dict:
    """Mean/std accuracy and NMI (x100) of k-means over `config.trials` seeds, k = number of distinct labels:
    scikit-learn on the cores (`kmeans_trials`) or batched on `device`, the scoring model's device
    (`device_kmeans_trials`), as `config.kmeans` picks."""
    labels = np.asarray(labels)
    if len(embeddings) != len(labels):
        raise DataError(f"{len(embeddings)} embeddings but {len(labels)} labels")
    classes = len(np.unique(labels))
    if classes < 2 or classes > len(labels):
        raise DataError(f"clustering needs at least 2 labels and no more labels than examples; got {classes} labels "
                        f"for {len(labels)} examples")
    backend = config.backend(device)
    if backend == "device":
        runs = device_kmeans_trials(embeddings, classes, config, device or "cpu", workers)
    else:
        runs = kmeans_trials(embeddings, classes, config, workers)
    accuracy = [100 * hungarian_accuracy(predicted, labels) for predicted in runs]
    nmi = [100 * normalized_mutual_info_score(labels, predicted) for predicted in runs]
    ddof = 1 if config.trials > 1 else 0
    return {"accuracy": float(np.mean(accuracy)), "accuracy_std": float(np.std(accuracy, ddof=ddof)),
            "nmi": float(np.mean(nmi)), "nmi_std": float(np.std(nmi, ddof=ddof)), "trials": accuracy,
            "classes": classes, "examples": len(labels),
            "kmeans": "scikit-learn" if backend == "sklearn" else f"batched torch on {torch.device(device or 'cpu')}"}


class ClusteringFamily(LabeledFamily):
    """Short-text clustering: k-means with k = the number of gold labels, over `trials` seeds; Hungarian-matched
    accuracy x100 (mean; std and NMI alongside)."""

    name = "clustering"
    title = "Short-text clustering"
    summary = "KMeans(k = #labels, n_init=10), seeds 0..9, Hungarian accuracy x100 (mean; std and NMI in results.json)"
    axis_label = "clustering accuracy x100"
    Settings = ClusteringConfig

    def score_task(self, task: LabeledTask, embeddings: np.ndarray) -> dict:
        """k-means on the scoring model's device (`self.device`) or on the CPU's cores, as the settings' `kmeans`
        picks."""
        started = time.perf_counter()
        part = task.splits["all"]
        record = evaluate_clustering(embeddings[part["left"]], part["labels"], self.settings, device=self.device)
        record["seconds"] = round(time.perf_counter() - started, 2)
        return record

    def describe(self) -> dict:
        return self.settings.describe()

    def describe_task(self, task: LabeledTask) -> dict:
        return {**super().describe_task(task), "protocol": task.spec.record.get("protocol", "kmeans")}
