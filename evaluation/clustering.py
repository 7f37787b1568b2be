"""Short-text clustering as the sentence-representations reference evaluates it (amazon-science, cited by the
extraction study): `KMeans(n_clusters=#gold labels, random_state=trial, n_init=10)` for trial 0..9 on the frozen
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
cores: the scores are the one-thread scores whatever the core count.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score
from sklearn.utils.extmath import row_norms
from threadpoolctl import threadpool_limits

from promptemb.common.errors import DataError


@dataclass(frozen=True)
class ClusteringConfig:
    trials: int = 10
    n_init: int = 10

    def describe(self) -> dict:
        return {"method": "KMeans(n_clusters=#labels, random_state=trial, n_init), Hungarian accuracy", **asdict(self)}


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
    ten initialisations end up drawing nearly every point."""

    def __init__(self, centred: np.ndarray, cache_bytes: int = 1 << 30, block_rows: int = 256):
        self.x = centred
        self.x64 = centred.astype(np.float64)
        self.norms64 = row_norms(self.x64, squared=True)
        self.weights = np.ones(len(centred), dtype=centred.dtype)
        self.block_rows = block_rows
        self.blocks: dict[int, np.ndarray] = {}  # block number -> float32 [block_rows, n] distance rows
        self.max_blocks = cache_bytes // (4 * len(centred) * block_rows)

    def compute(self, rows: np.ndarray | slice) -> np.ndarray:
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


def seeder_for(x: np.ndarray) -> PlusPlusSeeder:
    """The seeder for float32 data `x`, centred as scikit-learn's KMeans centres it (its float32 column mean)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    centred = x.copy()
    centred -= x.mean(axis=0)
    return PlusPlusSeeder(centred)


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """True when two labelings are the same clustering up to a renaming of the clusters."""
    forward, backward = {}, {}
    for x, y in zip(a.tolist(), b.tolist()):
        if forward.setdefault(x, y) != y or backward.setdefault(y, x) != x:
            return False
    return True


def kmeans_labels(x: np.ndarray, k: int, random_state: int, n_init: int, seeder: PlusPlusSeeder | None = None
                  ) -> np.ndarray:
    """The labels of `KMeans(n_clusters=k, random_state=random_state, n_init=n_init).fit_predict(x)` for dense
    float32 `x`: the same seeds per initialisation, scikit-learn's Lloyd run from each, and its rule for the best run
    (lower inertia and a different clustering replaces the best so far). Pass the same `seeder` (built by
    `seeder_for(x)`) to calls on the same data to share its distance rows."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    seeder = seeder or seeder_for(x)
    rng = np.random.RandomState(random_state)
    best_labels, best_inertia = None, None
    for _ in range(n_init):
        # X[indices] - mean is exactly the centred seed scikit-learn would start from
        run = KMeans(n_clusters=k, init=x[seeder.seed(k, rng)], n_init=1).fit(x)
        if best_inertia is None or (run.inertia_ < best_inertia and not same_partition(run.labels_, best_labels)):
            best_labels, best_inertia = run.labels_, run.inertia_
    return best_labels


def kmeans_trials(x: np.ndarray, k: int, config: ClusteringConfig, workers: int | None = None) -> list[np.ndarray]:
    """`kmeans_labels` for random states 0..trials-1, side by side on `workers` threads (default: the cores this
    process may use), each k-means on one OpenMP thread: the labels scikit-learn gives on one thread."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    seeder = seeder_for(x)
    workers = workers or min(config.trials, len(os.sched_getaffinity(0)))

    def trial_labels(trial: int) -> np.ndarray:
        # OpenMP's thread count is a per-thread setting: limit it in the thread that runs the k-means
        with threadpool_limits(limits=1, user_api="openmp"):
            return kmeans_labels(x, k, trial, config.n_init, seeder)

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(trial_labels, range(config.trials)))


def evaluate_clustering(embeddings: np.ndarray, labels: np.ndarray, config: ClusteringConfig = ClusteringConfig(),
                        workers: int | None = None) -> dict:
    """Mean/std accuracy and NMI (x100) of k-means over `config.trials` seeds (`kmeans_trials`), k = number of
    distinct labels."""
    labels = np.asarray(labels)
    if len(embeddings) != len(labels):
        raise DataError(f"{len(embeddings)} embeddings but {len(labels)} labels")
    classes = len(np.unique(labels))
    if classes < 2 or classes > len(labels):
        raise DataError(f"clustering needs at least 2 labels and no more labels than examples; got {classes} labels "
                        f"for {len(labels)} examples")
    runs = kmeans_trials(embeddings, classes, config, workers)
    accuracy = [100 * hungarian_accuracy(predicted, labels) for predicted in runs]
    nmi = [100 * normalized_mutual_info_score(labels, predicted) for predicted in runs]
    ddof = 1 if config.trials > 1 else 0
    return {"accuracy": float(np.mean(accuracy)), "accuracy_std": float(np.std(accuracy, ddof=ddof)),
            "nmi": float(np.mean(nmi)), "nmi_std": float(np.std(nmi, ddof=ddof)), "trials": accuracy,
            "classes": classes, "examples": len(labels)}
