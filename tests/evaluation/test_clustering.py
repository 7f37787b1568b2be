"""Clustering evaluator against brute force; labelled-task readers, registry groups and their bad-input errors."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import numpy as np
import pytest
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.labeled_readers import read_clustering
from promptemb.data.tasks import TaskSpec, get_tasks, load_registry
from promptemb.evaluation.clustering import (
    ClusteringConfig,
    PlusPlusSeeder,
    evaluate_clustering,
    hungarian_accuracy,
    kmeans_labels,
    kmeans_trials,
    same_partition,
    seeder_for,
)


def brute_force_accuracy(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Best accuracy over every one-to-one map of cluster ids to label ids."""
    size = int(max(predicted.max(), gold.max())) + 1
    best = 0
    for mapping in itertools.permutations(range(size)):
        best = max(best, int(sum(mapping[p] == g for p, g in zip(predicted, gold))))
    return best / len(gold)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_hungarian_accuracy_equals_brute_force(k):
    rng = np.random.default_rng(k)
    for _ in range(5):
        gold = rng.integers(0, k, size=23)
        predicted = rng.integers(0, k, size=23)
        assert hungarian_accuracy(predicted, gold) == pytest.approx(brute_force_accuracy(predicted, gold), abs=1e-12)
    # a relabelled perfect clustering scores 1
    gold = np.arange(30) % k
    assert hungarian_accuracy((gold + 1) % k, gold) == 1.0


def test_evaluate_clustering_matches_plain_kmeans_loop():
    rng = np.random.default_rng(0)
    labels = np.arange(60) % 3
    x = (rng.normal(size=(3, 4)) * 0.8)[labels] + rng.normal(size=(60, 4))
    config = ClusteringConfig(trials=3, n_init=2)
    result = evaluate_clustering(x, labels, config)
    accuracies = [100 * brute_force_accuracy(KMeans(3, random_state=t, n_init=2).fit_predict(x.astype(np.float32)),
                                             labels) for t in range(3)]
    np.testing.assert_allclose(result["trials"], accuracies)
    assert result["accuracy"] == pytest.approx(np.mean(accuracies))
    assert result["accuracy_std"] == pytest.approx(np.std(accuracies, ddof=1))
    assert result["classes"] == 3 and result["examples"] == 60

    separated = np.repeat(np.eye(4) * 50, 5, axis=0)
    perfect = evaluate_clustering(separated, np.repeat([3, 0, 2, 1], 5), config)
    assert perfect["accuracy"] == 100.0 and perfect["nmi"] == pytest.approx(100.0)


@pytest.mark.parametrize("k, n_init", [(2, 3), (7, 10), (25, 4)])
def test_kmeans_labels_equal_scikit_learns_kmeans(k, n_init):
    """Same seeds, same Lloyd runs, same best run: the labels equal `KMeans(...).fit_predict` for several random
    states, with the distance-row cache shared across calls, and with no cache at all."""
    rng = np.random.default_rng(k)
    centres = rng.normal(size=(k, 12)) * 1.5
    x = (centres[rng.integers(0, k, size=400)] + rng.normal(size=(400, 12))).astype(np.float32) + 3.0
    shared = seeder_for(x)
    for seed in range(4):
        expected = KMeans(n_clusters=k, random_state=seed, n_init=n_init).fit_predict(x)
        np.testing.assert_array_equal(kmeans_labels(x, k, seed, n_init, shared), expected)
    uncached = PlusPlusSeeder(shared.x, cache_bytes=0)
    np.testing.assert_array_equal(kmeans_labels(x, k, 1, n_init, uncached),
                                  KMeans(n_clusters=k, random_state=1, n_init=n_init).fit_predict(x))
    assert not uncached.blocks and shared.blocks
    few_small_blocks = PlusPlusSeeder(shared.x, cache_bytes=4 * len(x) * 7 * 20, block_rows=7)  # 20 of 58 blocks
    np.testing.assert_array_equal(kmeans_labels(x, k, 2, n_init, few_small_blocks),
                                  KMeans(n_clusters=k, random_state=2, n_init=n_init).fit_predict(x))
    assert 0 < len(few_small_blocks.blocks) <= 20
    for block, rows in few_small_blocks.blocks.items():
        np.testing.assert_array_equal(rows, uncached.compute(np.arange(block * 7, min(block * 7 + 7, len(x)))))


def test_trials_run_side_by_side_with_one_thread_kmeans():
    """Parallel trials give the labels of scikit-learn's KMeans on one OpenMP thread, trial by trial, whatever the
    number of workers. On this data two OpenMP threads give other labels in trial 0 (its summation grouping differs),
    which is why each trial is pinned to one thread."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(5, 16)) * 0.7
    labels = rng.integers(0, 5, size=3000)
    x = (centres[labels] + rng.normal(size=(3000, 16))).astype(np.float32)
    config = ClusteringConfig(trials=2, n_init=3)
    with threadpool_limits(limits=1, user_api="openmp"):
        expected = [KMeans(n_clusters=5, random_state=t, n_init=3).fit_predict(x) for t in range(2)]
    with threadpool_limits(limits=2, user_api="openmp"):
        two_threads = KMeans(n_clusters=5, random_state=0, n_init=3).fit_predict(x)
    assert not np.array_equal(two_threads, expected[0])
    for workers in (1, 2):
        for got, want in zip(kmeans_trials(x, 5, config, workers), expected, strict=True):
            np.testing.assert_array_equal(got, want)


def test_same_partition_is_equality_up_to_renaming():
    assert same_partition(np.array([0, 0, 1, 2]), np.array([2, 2, 0, 1]))
    assert not same_partition(np.array([0, 0, 1, 2]), np.array([2, 2, 0, 0]))
    assert not same_partition(np.array([0, 1, 1]), np.array([0, 0, 1]))


def test_clustering_bad_input():
    with pytest.raises(DataError, match="3 embeddings but 2 labels"):
        evaluate_clustering(np.zeros((3, 2)), np.array([0, 1]))
    with pytest.raises(DataError, match="at least 2 labels"):
        evaluate_clustering(np.zeros((3, 2)), np.array([1, 1, 1]))
    with pytest.raises(DataError, match="same non-zero length"):
        hungarian_accuracy(np.array([0, 1]), np.array([0]))


def test_read_clustering_quirks_and_missing_label(tmp_path):
    path = tmp_path / "set.txt"
    # CRLF, a trailing empty tab field, a tab inside the text (split on the first tab only), labels as strings
    path.write_bytes(b"10\tfirst text\t\r\n2\tsecond\tpart two\r\n10\t  third   text \r\n")
    split, names = read_clustering(path)
    assert split.sentences == ["first text", "second part two", "third text"]
    assert names == ["2", "10"] and split.labels.tolist() == [1, 0, 1]
    path.write_text("1\tok\nno label field here\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path}:2: expected 'label<TAB>text'"):
        read_clustering(path)


def _record(tmp_path: Path, files: dict[str, str]) -> dict:
    entries = {}
    for split, text in files.items():
        path = tmp_path / f"{split}.label"
        path.write_text(text, encoding="latin-1")
        entries[split] = {"path": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                          "size": len(text.splitlines())}
    return {"family": "transfer", "format": "trec", "protocol": "kfold", "split": "test", "size": 1,
            "main_score": "accuracy", "encoding": "latin-1", "splits": entries}


def test_transfer_reader_order_and_missing_split(tmp_path):
    record = _record(tmp_path, {"train": "NUM:dist How far is it ?\nHUM:ind Who ?\nLOC:city Where is it ?\n",
                                "test": "DESC:def What is caf\xe9 ?\n"})
    spec = TaskSpec("TREC", "trec", "test", 1, "accuracy", record, family="transfer")
    splits = spec.load_labeled(tmp_path)
    assert splits["train"].sentences == ["Who ?", "Where is it ?", "How far is it ?"]  # SentEval's (length, label)
    assert splits["train"].labels.tolist() == [3, 4, 5]
    assert splits["test"].sentences == ["What is caf\xe9 ?"]  # latin-1
    (tmp_path / "test.label").unlink()
    with pytest.raises(DataError, match=r"missing data file .*test\.label"):
        spec.load_labeled(tmp_path)


def test_task_groups_mixing_and_unknown_names():
    registry = load_registry()
    assert [t.name for t in get_tasks(["MR", "agnews"], registry)] == ["MR", "agnews"]
    groups = registry.groups
    assert [t.name for t in get_tasks(["transfer"], registry)] == list(groups["transfer"])
    assert len(get_tasks(["all"], registry)) == len(groups["sts"] + groups["transfer"] + groups["clustering"])
    mixed = get_tasks(["STS12", "sts", "TREC"], registry)
    assert [t.name for t in mixed] == [*groups["sts"], "TREC"]
    assert {t.family for t in get_tasks(["clustering"], registry)} == {"clustering"}
    with pytest.raises(ConfigError) as err:
        get_tasks(["MR", "nope"], registry)
    message = str(err.value)
    assert "unknown task nope" in message and "MR" in message and "agnews" in message
    assert "valid groups: sts, transfer, clustering, all" in message
    with pytest.raises(DataError, match="format 'binary' has no scored pairs"):
        registry["MR"].load(Path("."))


def test_real_labeled_tasks_load(real_data_root):
    sizes = {spec.name: {split: len(v) for split, v in spec.load_labeled(real_data_root).items()}
             for spec in get_tasks(["MRPC", "SICK-E", "tweet"])}
    assert sizes == {"MRPC": {"train": 4076, "test": 1725}, "SICK-E": {"train": 4500, "dev": 500, "test": 4927},
                     "tweet": {"all": 2472}}
    cr = get_tasks(["CR"])[0].load_labeled(real_data_root)["all"]  # 4 blank lines, kept as SentEval keeps them
    assert len(cr) == 3775 and cr.sentences[:4] == [""] * 4 and "" not in cr.sentences[4:]


def blobs(k: int, n: int = 400, dim: int = 12, seed: int = 0, spread: float = 1.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)) * spread
    return (centres[rng.integers(0, k, size=n)] + rng.normal(size=(n, dim))).astype(np.float32) + 3.0


@pytest.mark.parametrize("k, n_init", [(2, 3), (7, 10), (25, 4)])
def test_batched_lloyd_runs_equal_scikit_learns_runs(k, n_init):
    """`lloyd_runs` (the device k-means, here on the CPU) against scikit-learn's single Lloyd run from the same
    centred seeds, run by run: same labels, same inertia (to float rounding), for runs that stop at different
    iterations, with strict and tolerance convergence, and through several memory chunks."""
    from sklearn.cluster import KMeans

    from promptemb.evaluation.clustering import kmeans_tolerance, lloyd_runs, trial_seeds

    x = blobs(k, seed=k)
    seeder = seeder_for(x)
    seeds = [s for trial in range(3) for s in trial_seeds(seeder, k, trial, n_init)]
    inits = np.stack([seeder.x[s] for s in seeds])
    for memory in (1 << 30, 4 * len(x) * k * 2):  # everything at once; two runs per chunk
        runs = lloyd_runs(seeder.x, inits, "cpu", kmeans_tolerance(x), memory_bytes=memory)
        for (labels, inertia), s in zip(runs, seeds, strict=True):
            reference = KMeans(n_clusters=k, init=x[s], n_init=1).fit(x)
            np.testing.assert_array_equal(labels, reference.labels_)
            assert inertia == pytest.approx(reference.inertia_, rel=1e-5)
    given = inits.copy()
    few = lloyd_runs(seeder.x, inits[:4], "cpu", kmeans_tolerance(x), max_iter=1)  # one step, then assign
    for (labels, _), s in zip(few, seeds[:4]):
        np.testing.assert_array_equal(labels, KMeans(n_clusters=k, init=x[s], n_init=1, max_iter=1).fit(x).labels_)
    np.testing.assert_array_equal(inits, given)  # the caller's initial centres are left as they were


def test_batched_lloyd_relocates_empty_clusters_as_scikit_learn():
    """Duplicate initial centres leave clusters empty (ties go to the first centre): each takes one of the points
    farthest from their centre, exactly as scikit-learn's `_relocate_empty_clusters_dense`."""
    from sklearn.cluster import KMeans

    from promptemb.evaluation.clustering import kmeans_tolerance, lloyd_runs

    x = blobs(5, n=300, seed=3)
    centred = seeder_for(x).x
    for picks in ([0, 0, 1, 2, 3], [7, 7, 7, 9, 11], [4, 4, 8, 8, 15]):
        (labels, inertia), = lloyd_runs(centred, centred[picks][None], "cpu", kmeans_tolerance(x))
        reference = KMeans(n_clusters=5, init=x[picks], n_init=1).fit(x)
        np.testing.assert_array_equal(labels, reference.labels_)
        assert len(np.unique(labels)) == 5 and inertia == pytest.approx(reference.inertia_, rel=1e-5)


@pytest.mark.parametrize("k, n_init", [(3, 4), (9, 10)])
def test_device_kmeans_equals_scikit_learns_kmeans(k, n_init):
    """The device path (`kmeans="device"`, run here on the CPU: the code a GPU runs) gives
    `KMeans(n_clusters=k, random_state=trial, n_init).fit_predict` for every trial, and evaluate_clustering the
    same scores through either backend; `auto` picks scikit-learn for a CPU model, the device for a GPU one."""
    from promptemb.evaluation.clustering import device_kmeans_trials

    x = blobs(k, seed=10 + k)
    config = ClusteringConfig(trials=3, n_init=n_init)
    with threadpool_limits(limits=1, user_api="openmp"):
        expected = [KMeans(n_clusters=k, random_state=t, n_init=n_init).fit_predict(x) for t in range(3)]
    for got, want in zip(device_kmeans_trials(x, k, config, "cpu"), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    labels = np.arange(len(x)) % k
    on_device = evaluate_clustering(x, labels, ClusteringConfig(trials=3, n_init=n_init, kmeans="device"))
    on_cores = evaluate_clustering(x, labels, config)
    assert on_device["trials"] == on_cores["trials"] and on_device["nmi"] == pytest.approx(on_cores["nmi"])
    assert on_device["kmeans"] == "batched torch on cpu" and on_cores["kmeans"] == "scikit-learn"
    assert config.backend("cpu") == "sklearn" and config.backend(None) == "sklearn"
    assert config.backend("cuda:0") == "device" and ClusteringConfig(kmeans="sklearn").backend("cuda") == "sklearn"


def test_kmeans_trials_spread_every_run_over_the_workers(monkeypatch):
    """The unit of work is one (trial, initialisation) Lloyd run: with 3 trials x 4 initialisations, 12 runs go to
    the pool (not 3), and the labels stay scikit-learn's whatever the number of workers."""
    import promptemb.evaluation.clustering as clustering

    x = blobs(4, n=200, seed=5)
    calls = []
    original = clustering.sklearn_lloyd
    monkeypatch.setattr(clustering, "sklearn_lloyd", lambda data, seeds: calls.append(1) or original(data, seeds))
    config = ClusteringConfig(trials=3, n_init=4)
    with threadpool_limits(limits=1, user_api="openmp"):
        expected = [KMeans(n_clusters=4, random_state=t, n_init=4).fit_predict(x) for t in range(3)]
    for workers in (1, 5):
        calls.clear()
        for got, want in zip(kmeans_trials(x, 4, config, workers), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        assert len(calls) == 12


def test_seeding_rows_computed_on_a_device_equal_the_hosts():
    """The device k-means computes the seeding's distance rows with torch on its device (here the CPU): the same
    float64 arithmetic, so the float32 rows and the seeds equal numpy's."""
    from promptemb.evaluation.clustering import trial_seeds

    x = blobs(6, n=300, seed=7)
    host, device = seeder_for(x), seeder_for(x, "cpu")
    np.testing.assert_allclose(device.compute(slice(0, 40)), host.compute(slice(0, 40)), rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(device.compute(np.array([5, 1, 299])), host.compute(np.array([5, 1, 299])),
                               rtol=1e-6, atol=1e-4)
    for trial in range(3):
        for a, b in zip(trial_seeds(device, 6, trial, 4), trial_seeds(host, 6, trial, 4), strict=True):
            np.testing.assert_array_equal(a, b)
