"""Fault injection, the pre-tokenized cache: a truncated table, random bytes, a zeroed 4 KB block, a lost or garbled
record, a missing file. Each is found when the cache is opened and the cache is rebuilt with one warning line, the
rebuilt table equal to the first one; nothing (staging or damaged folders) is left behind; concurrent builders over
a damaged cache all get the same good table."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from promptemb.data import table_cache
from promptemb.data.pretokenized import SentenceTokenization, pretokenized_corpus
from promptemb.data.table_cache import RECORD_FILE
from tests import cache_builder_worker
from tests.cache_builder_worker import SENTENCES, tokenization_of
from tests.faults import listing, run_entry
from tests.training.test_train import tiny_overrides


def arrow_file(cache: Path) -> Path:
    (folder,) = [p for p in (cache / "pretokenized").iterdir() if not p.name.startswith(".")]
    return next(folder.glob("*.arrow"))


def damage(cache: Path, fault: str) -> None:
    arrow = arrow_file(cache)
    data = bytearray(arrow.read_bytes())
    if fault == "truncated":
        arrow.write_bytes(bytes(data[: len(data) // 2]))
    elif fault == "random_bytes":
        arrow.write_bytes(os.urandom(len(data)))
    elif fault == "zeroed_4kb":
        start = len(data) // 2
        data[start : start + 4096] = bytes(4096)
        stat = arrow.stat()
        arrow.write_bytes(bytes(data))
        os.utime(arrow, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as bit rot: same size, same time stamp
    elif fault == "record_garbled":
        (arrow.parent / RECORD_FILE).write_text("{not json")
    elif fault == "record_of_another_corpus":
        record = json.loads((arrow.parent / RECORD_FILE).read_text())
        (arrow.parent / RECORD_FILE).write_text(json.dumps({**record, "rows": record["rows"] - 1}))
    elif fault == "table_missing":
        arrow.unlink()


FAULTS = {"truncated": "bytes, not the", "random_bytes": "does not match the sha256",
          "zeroed_4kb": "does not match the sha256", "record_garbled": "is unreadable",
          "record_of_another_corpus": "rows, not the", "table_missing": "is missing"}


@pytest.fixture(scope="module")
def tokenization(tiny_bert) -> SentenceTokenization:
    return tokenization_of(tiny_bert)


def rows(table) -> list:
    """The rows as Python lists: a copy, not a view of the memory-mapped file that the test then damages."""
    return [list(ids) for ids in table["ids0"]]


def damage_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "is damaged" in r.getMessage()]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_cache_is_rebuilt_with_one_warning(tokenization, tmp_path, caplog, fault):
    expected = rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path))
    damage(tmp_path, fault)
    with caplog.at_level(logging.WARNING, logger=table_cache.__name__):
        rebuilt = pretokenized_corpus(SENTENCES, tokenization, tmp_path)
    (warning,) = damage_warnings(caplog)
    assert FAULTS[fault] in warning and "rebuilding it" in warning and "\n" not in warning
    assert rows(rebuilt) == expected
    caplog.clear()
    again = pretokenized_corpus(SENTENCES, tokenization, tmp_path, verify=True)  # the rebuilt cache checks out
    assert rows(again) == expected and not damage_warnings(caplog)
    assert not [p for p in listing(tmp_path / "pretokenized") if Path(p).name.startswith(".")]  # nothing left


def test_large_caches_are_checked_by_size_and_rows_and_hashed_on_request(tokenization, tmp_path, caplog,
                                                                         monkeypatch):
    monkeypatch.setattr(table_cache, "FULL_CHECK_BYTES", 0)  # every cache counts as large
    expected = rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path))
    damage(tmp_path, "truncated")
    with caplog.at_level(logging.WARNING, logger=table_cache.__name__):
        assert rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path)) == expected  # size: always checked
    assert len(damage_warnings(caplog)) == 1
    damage(tmp_path, "random_bytes")  # same size: found by the hash of the file's start and end
    with caplog.at_level(logging.WARNING, logger=table_cache.__name__):
        assert rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path)) == expected
    assert len(damage_warnings(caplog)) == 2 and "of its start and end" in damage_warnings(caplog)[-1]
    monkeypatch.setattr(table_cache, "EDGE_BYTES", 1024)  # (this small table is all edges otherwise)
    pretokenized_corpus(SENTENCES, tokenization, tmp_path)  # rebuilt with edges of the new size
    damage(tmp_path, "zeroed_4kb")  # in the middle, same size: found by the full hash, which verify=True asks for
    with caplog.at_level(logging.WARNING, logger=table_cache.__name__):
        assert rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path, verify=True)) == expected
    assert len(damage_warnings(caplog)) == 4


def test_concurrent_threads_over_a_damaged_cache_agree(tokenization, tmp_path, caplog):
    expected = rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path))
    damage(tmp_path, "random_bytes")
    with caplog.at_level(logging.WARNING, logger=table_cache.__name__), ThreadPoolExecutor(3) as pool:
        tables = list(pool.map(lambda _: pretokenized_corpus(SENTENCES, tokenization, tmp_path), range(3)))
    assert all(rows(table) == expected for table in tables) and 1 <= len(damage_warnings(caplog)) <= 3
    assert len(list((tmp_path / "pretokenized").iterdir())) == 1  # one cache, no staging or damaged folder left


def test_a_cache_file_vanishing_mid_check_is_a_rebuild_not_a_traceback(tokenization, tmp_path, caplog, monkeypatch):
    """The race the threads above can hit: another builder moves the damaged cache aside between the record read and
    a file's stat (emulated: the first edge hash finds its file gone)."""
    expected = rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path))
    original, calls = table_cache.edges_sha256, []

    def vanishing(path):
        calls.append(path)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return original(path)

    monkeypatch.setattr(table_cache, "edges_sha256", vanishing)
    with caplog.at_level(logging.WARNING, logger=table_cache.__name__):
        assert rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path)) == expected
    assert [w for w in damage_warnings(caplog) if "its files changed while being checked (No such file" in w]
    assert len(list((tmp_path / "pretokenized").iterdir())) == 1


@pytest.mark.slow
def test_concurrent_builders_over_a_damaged_cache_agree(tiny_bert, tokenization, tmp_path):
    expected = rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path))
    damage(tmp_path, "random_bytes")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    builders = [context.Process(target=cache_builder_worker.build, args=(str(tiny_bert), str(tmp_path), queue))
                for _ in range(3)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(300)
    assert [builder.exitcode for builder in builders] == [0, 0, 0]
    assert [queue.get(timeout=5) for _ in builders] == [len(SENTENCES)] * 3
    assert rows(pretokenized_corpus(SENTENCES, tokenization, tmp_path, verify=True)) == expected
    assert len(list((tmp_path / "pretokenized").iterdir())) == 1  # one cache, no staging or damaged folder left


@pytest.mark.slow
def test_train_py_rebuilds_a_damaged_cache_with_one_warning(tiny_bert, real_data_root, tmp_path):
    cache = tmp_path / "cache"

    def train(out):
        return run_entry("train.py", *tiny_overrides("quickstart_unsup", tiny_bert, real_data_root, out, None),
                         f"+data.cache_dir={cache}", "trainer.max_steps=1",
                         "callbacks.sts_evaluation.score_best_at_end=false", data_root=real_data_root, cwd=tmp_path)

    first = train(tmp_path / "run")
    assert first.returncode == 0, first.stderr[-3000:]
    damage(cache, "random_bytes")
    again = train(tmp_path / "run2")
    assert again.returncode == 0, again.stderr[-3000:]
    output = again.stdout + again.stderr
    assert output.count("is damaged") == 1 and "Traceback" not in output
