"""Short-text clustering as the sentence-representations reference evaluates it (amazon-science, cited by the
extraction study): `KMeans(n_clusters=#gold labels, random_state=trial, n_init=10)` for trial 0..9 on the frozen
embeddings; accuracy = the best one-to-one matching of clusters to labels (Hungarian algorithm on the confusion
matrix, scipy's `linear_sum_assignment`) x100; NMI (scikit-learn, arithmetic normalisation) x100 alongside. Reported
as mean and sample standard deviation (ddof=1, as the reference's pandas `std`) over the trials.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score

from common.errors import DataError


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


def evaluate_clustering(embeddings: np.ndarray, labels: np.ndarray, config: ClusteringConfig = ClusteringConfig()
                        ) -> dict:
    """Mean/std accuracy and NMI (x100) of k-means over `config.trials` seeds, k = number of distinct labels."""
    labels = np.asarray(labels)
    if len(embeddings) != len(labels):
        raise DataError(f"{len(embeddings)} embeddings but {len(labels)} labels")
    classes = len(np.unique(labels))
    if classes < 2 or classes > len(labels):
        raise DataError(f"clustering needs at least 2 labels and no more labels than examples; got {classes} labels "
                        f"for {len(labels)} examples")
    x = np.asarray(embeddings, dtype=np.float32)
    accuracy, nmi = [], []
    for trial in range(config.trials):
        predicted = KMeans(n_clusters=classes, random_state=trial, n_init=config.n_init).fit_predict(x)
        accuracy.append(100 * hungarian_accuracy(predicted, labels))
        nmi.append(100 * normalized_mutual_info_score(labels, predicted))
    ddof = 1 if config.trials > 1 else 0
    return {"accuracy": float(np.mean(accuracy)), "accuracy_std": float(np.std(accuracy, ddof=ddof)),
            "nmi": float(np.mean(nmi)), "nmi_std": float(np.std(nmi, ddof=ddof)), "trials": accuracy,
            "classes": classes, "examples": len(labels)}
