"""Corpora read in one streaming pass into memory-mapped Arrow tables (data/corpus_tables.py): the same examples,
batches and counts as the in-memory path they replaced (the readers of that path are copied below; the batch digests
were recorded with it, at commit 0362349), a cache keyed on the files' bytes, and a held-out filter that says what it
dropped and why when nothing is left to train on."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from promptemb.common.errors import DataError
from promptemb.data import corpus_tables, table_cache
from promptemb.data.corpus_tables import CorpusSource, corpus_table
from promptemb.data.datamodules import TextLinesDataModule, TripletDataModule
from promptemb.data.readers import read_utf8_text
from promptemb.data.training_corpora import (
    NLI_COLUMNS,
    held_out_sentences,
    iter_nli_csv,
    iter_text_lines,
    normalise_for_matching,
)
from tests.conftest import REPO
from tests.faults import run_entry
from tests.helpers import MINILM, assert_one_line_error

# -- the in-memory path before streaming (data/training_corpora.py and the datamodule's filter at 0362349) ----------


def in_memory_text_lines(paths):
    sentences = []
    for path in paths:
        sentences += [line.strip() for line in io.StringIO(read_utf8_text(path), newline=None) if line.strip()]
    return sentences


def in_memory_nli_csv(path):
    with io.StringIO(read_utf8_text(path), newline="") as handle:
        return [tuple((row[c] or "").strip() for c in NLI_COLUMNS) for row in csv.DictReader(handle)]


def in_memory_filter(examples, held: set, max_examples=None):
    kept = [e for e in examples if not any(normalise_for_matching(s) in held
                                           for s in ((e,) if isinstance(e, str) else e))]
    return kept[:max_examples] if max_examples else kept, len(examples) - len(kept)


# -- what the readers must split, strip and keep exactly as before ---------------------------------------------------

#: Line ends of every kind (\r\n split across the reader's 8 KiB buffer too), characters str.splitlines() would
#: break at but text files do not (\u2028, \x85, \x0b, \x0c, \x1c), a BOM, Unicode spaces strip() removes, blank and
#: whitespace-only lines, duplicates.
TRICKY_LINES = ["\ufeffa line after a BOM", "unicode line separator\u2028inside", "next line\x85inside",
                "vertical\x0btab and form\x0cfeed", "file\x1cseparator", "  padded\t ", "\u3000ideographic\u3000",
                "", "   ", "\t", "dup", "dup", "w" * 9000, "after the long one"]


def tricky_text(path: Path) -> Path:
    text = "\r\n".join(TRICKY_LINES[:4]) + "\r" + "\n".join(TRICKY_LINES[4:]) + "\n"
    filler = "x" * ((8191 - len(text.encode())) % 8192)  # the next \r ends one 8 KiB buffer, its \n starts the next
    path.write_bytes((text + filler + "\r\nlast line without an end").encode())
    return path


def test_streamed_text_lines_equal_the_in_memory_reader(tmp_path, monkeypatch):
    files = [tricky_text(tmp_path / "a.txt"), tmp_path / "b.txt"]
    files[1].write_bytes(b"second file\r\n\r\n  \nend")
    expected = in_memory_text_lines(files)
    assert list(iter_text_lines(files)) == expected and len(expected) == 15
    assert tricky_text(tmp_path / "c.txt").read_bytes()[16383:16385] == b"\r\n"
    monkeypatch.setattr(corpus_tables, "WRITE_BATCH", 3)  # several record batches, the last one partial
    dm = TextLinesDataModule([str(f) for f in files], batch_size=2, held_out_tasks=[], cache_dir=str(tmp_path / "c"),
                             pretokenize=False)
    dm.setup("fit")
    assert list(dm.examples) == expected and dm.examples[len(expected) - 1] == "end"
    assert dm.corpus.table.data.column("text0").num_chunks == 5
    assert [batch for batch in dm.train_dataloader()] == [[expected[i] for i in b]
                                                          for b in _index_batches(len(expected), 2, dm.seed)]


def test_invalid_utf8_far_into_a_streamed_file_names_its_line(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"".join(b"line %d\r\n" % i for i in range(5000)) + b"ok \xe2\x82\n")
    with pytest.raises(DataError, match=r"corpus\.txt:5001: not valid UTF-8 \(invalid continuation byte: byte 0xe2 "
                                        r"at byte 4 of the line\)"):
        list(iter_text_lines([path]))
    with pytest.raises(DataError) as whole:
        read_utf8_text(path)
    with pytest.raises(DataError) as streamed:
        list(iter_text_lines([path]))
    assert str(streamed.value) == str(whole.value)


def test_streamed_nli_csv_equals_the_in_memory_reader(tmp_path):
    path = tmp_path / "nli.csv"
    path.write_bytes(b'sent0,sent1,hard_neg\r\n"a quoted, comma",  spaced  ,NA\r\n'
                     b'"a field over\r\ntwo lines",null,nan\n"""quoted"" word",x\xe2\x80\xa8y,z\rlast,row,here')
    expected = in_memory_nli_csv(path)
    assert list(iter_nli_csv(path)) == expected and len(expected) == 4
    assert expected[1] == ("a field over\r\ntwo lines", "null", "nan")  # kept as text, never as missing values
    dm = TripletDataModule(str(path), batch_size=2, held_out_tasks=[], cache_dir=str(tmp_path / "c"),
                           pretokenize=False)
    dm.setup("fit")
    assert list(dm.examples) == expected and dm.examples[0] == expected[0]


def _index_batches(size: int, batch: int, seed: int) -> list[list[int]]:
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i : i + batch] for i in range(0, size // batch * batch, batch)]


# -- the recipes give the batches they gave before streaming ---------------------------------------------------------

#: sha256 of every batch of epochs 0 and 1 (ids and lengths, or the raw examples as JSON), the number of batches, the
#: examples and the held-out drops: recorded with the in-memory path at 0362349, all-MiniLM-L6-v2's tokenizer.
RECORDED = {
    ("quickstart_unsup", True): ("e0255d6d18c780380dd02072e491c051b416d2a6e9ad9eb0c8992c892c0eabe7", 744, 11912, 2),
    ("quickstart_unsup", False): ("fa10184e3f556dd1d0f22b718af9cdd3c02b1ac09fc1cf49ec59f033affbc280", 744, 11912, 2),
    ("quickstart_unsup_grouped", True): ("86325e053ff168be97d6d8c63fa65378085a4914e235f73be2e9c04691424e2f", 312,
                                         5000, 2),
    ("quickstart_unsup_grouped", False): ("cc603d7f6348fe2a7c7f89ddd2d3b0d0af36444b0a2cc0a268b1ba60c7ac5fa6", 312,
                                          5000, 2),
    ("quickstart_sup", True): ("88f71255bdf6577d1de518731f1a7c9fde33557e2bb169610c80e8247eaf1c91", 30, 494, 0),
    ("quickstart_sup", False): ("cc7ab38b172f9504af2dc0bbd18f34bbf5c83d5d1c11a19da6a8501544d0a30f", 30, 494, 0),
    ("nli_csv", True): ("94ea2be4b08e01cf1e32784ee55a2caa8c740ec22c70e8738fcf1e36d8ae12b4", 8, 9, 0),
    ("nli_csv", False): ("b38d3187f0f57903ecd97823e29d02fbaa8f2de383576ef5bc4d36b3564a11df", 8, 9, 0),
}
RECIPES = {
    "quickstart_unsup": ["experiment=quickstart_unsup"],
    "quickstart_unsup_grouped": ["experiment=quickstart_unsup", "data.group_by_length=true",
                                 "data.distinct_in_batch=true", "data.max_examples=5000", "seed=7"],
    "quickstart_sup": ["experiment=quickstart_sup"],
    "nli_csv": ["experiment=promptbert_sup", "data.download=null",
                "data.file=training/partial/nli_for_simcse.first9rows.csv", "data.batch_size=2"],
}


def batches_digest(loader) -> tuple[str, int]:
    digest, count = hashlib.sha256(), 0
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            count += 1
            if isinstance(batch, dict):
                for part in (batch["ids"].numpy().tobytes(), batch["lengths"].numpy().tobytes(),
                             str(tuple(batch["ids"].shape)).encode()):
                    digest.update(part)
            else:
                digest.update(json.dumps(batch).encode())
    return digest.hexdigest(), count


@pytest.fixture(scope="module")
def minilm_modules():
    from promptemb.lightning_modules.promptbert import PromptBERTSup, PromptBERTUnsup

    torch.manual_seed(0)
    return {"unsup": PromptBERTUnsup(MINILM), "sup": PromptBERTSup(MINILM)}


@pytest.mark.parametrize("recipe, pretokenize", sorted(RECORDED))
def test_recipes_give_the_batches_of_the_in_memory_path(recipe, pretokenize, minilm_modules, real_data_root,
                                                         tmp_path):
    with initialize_config_dir(str(REPO / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*RECIPES[recipe], f"data_root={real_data_root}",
                                          f"+data.cache_dir={tmp_path}", f"data.pretokenize={pretokenize}"])
    dm = instantiate(cfg.data)
    recipe_module = minilm_modules["sup" if cfg.model._target_.endswith("PromptBERTSup") else "unsup"]
    dm.use_tokenization(recipe_module.sentence_tokenization())
    dm.setup("fit")
    assert (*batches_digest(dm.train_dataloader()), len(dm.examples), dm.dropped_held_out) == RECORDED[
        recipe, pretokenize]


# -- the cache: keyed on the files' bytes, verified, memory-mapped ---------------------------------------------------


def test_corpus_cache_is_keyed_on_the_files_bytes_and_memory_mapped(tiny_bert, tmp_path, caplog):
    from promptemb.lightning_modules.promptbert import PromptBERTUnsup

    module = PromptBERTUnsup(str(tiny_bert))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i}\n" for i in range(40)))
    cache = tmp_path / "cache"

    def prepared(path=corpus, **kwargs):
        dm = TextLinesDataModule([str(path)], batch_size=4, held_out_tasks=[], cache_dir=str(cache), **kwargs)
        dm.use_tokenization(module.sentence_tokenization())
        dm.setup("fit")
        return dm

    first = prepared()
    # training reads memory-mapped tables in the cache, not Python lists
    for table in (first.corpus.table, first.dataset.table):
        assert table.cache_files and all(Path(f["filename"]).is_relative_to(cache) for f in table.cache_files)
    record = next((cache / "corpora").iterdir()) / table_cache.RECORD_FILE
    stamp = record.stat().st_mtime_ns
    copy = tmp_path / "elsewhere.txt"
    copy.write_bytes(corpus.read_bytes())
    assert prepared(copy).corpus.name == first.corpus.name and record.stat().st_mtime_ns == stamp  # same bytes
    corpus.write_text(corpus.read_text().replace("number 7", "number 8"))  # same size, one byte changed
    names = {first.corpus.name, prepared().corpus.name, prepared(max_examples=20).corpus.name}
    assert len(names) == 3 and len(list((cache / "corpora").iterdir())) == 3
    assert len(list((cache / "pretokenized").iterdir())) == 3  # each corpus its own ids
    data = next(f for f in (cache / "corpora" / first.corpus.name).iterdir() if f.suffix == ".arrow")
    data.write_bytes(os.urandom(data.stat().st_size))
    with caplog.at_level(logging.WARNING):
        again = prepared(copy)
    assert [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()] == [
        f"corpus cache {cache / 'corpora' / first.corpus.name} is damaged ({data.name} does not match the sha256 "
        "of its start and end recorded when it was written); rebuilding it"]
    assert list(again.examples) == [f"sentence number {i}" for i in range(40)]
    assert not [p for p in (cache / "corpora").iterdir() if p.name.startswith(".")]  # no staging or damaged left


def test_held_out_filter_streamed_drops_what_the_in_memory_filter_dropped(real_data_root, tmp_path):
    dev = (real_data_root / "downstream/STS/STSBenchmark/sts-dev.csv").read_text().splitlines()
    held = [line.split("\t")[5] for line in dev[:30]]
    lines = [f"training sentence {i}" for i in range(100)]
    for i, sentence in enumerate(held):  # varied case and spacing still match
        lines.insert(3 * i, f"  {sentence.upper()}  " if i % 2 else sentence.replace(" ", "   "))
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    tasks = ("STSBenchmark-dev", "STS12", "transfer")
    reference = set(held_out_sentences(real_data_root, tasks).sentences)
    for limit in (None, 50):
        source = CorpusSource("lines", (path,), held_out_sentences(real_data_root, tasks), limit)
        table = corpus_table(source, tmp_path / "cache")
        kept, dropped = in_memory_filter(in_memory_text_lines([path]), reference, limit)
        assert list(table.table["text0"]) == kept and table.counts["dropped_held_out"] == dropped >= 30
        assert table.counts["dropped_by_task"]["STSBenchmark-dev"] == 30


# -- nothing left to train on: the held-out filter says what it dropped, and why --------------------------------------


@pytest.mark.slow
def test_sick_under_the_default_held_out_filter_is_one_line_naming_the_filter(tiny_bert, real_data_root, tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = run_entry("train.py", "experiment=promptbert_sup", "data.format=sick",
                     "data.file=downstream/SICK/SICK_train.txt", "data.download=null", "data.batch_size=128",
                     f"backbone.name_or_path={tiny_bert}", f"output_dir={out}", "trainer.accelerator=cpu",
                     "trainer.precision=32-true", f"+data.cache_dir={cache}", data_root=real_data_root, cwd=tmp_path)
    line = assert_one_line_error(
        proc, r"^error: corpus has 0 examples after filtering, fewer than one batch \(128\): the held-out filter "
              r"dropped all 494 examples read from \S+SICK_train\.txt, as they contain sentences of evaluated tasks "
              r"\(SICK-E: 494, SICKRelatedness: 486\), which training must never see; to train on SICK, use "
              r"data=sick_triplets \(it holds out the STS tasks only; the SICK-R score is then reported as "
              r"contaminated\)$", out)
    assert "lower data.batch_size" not in line
    assert not list((cache / "corpora").iterdir())  # nothing cached for a refused corpus


def test_too_few_examples_names_the_cure_that_fits(real_data_root, tmp_path):
    dev = (real_data_root / "downstream/STS/STSBenchmark/sts-dev.csv").read_text().splitlines()
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join([line.split("\t")[5] for line in dev[:6]] + ["one of ours", "two of ours"]) + "\n")

    def error(batch_size, **kwargs) -> str:
        dm = TextLinesDataModule([str(path)], batch_size=batch_size, cache_dir=str(tmp_path / "c"),
                                 data_root=str(real_data_root), pretokenize=False, **kwargs)
        with pytest.raises(DataError) as err:
            dm.setup("fit")
        assert "\n" not in str(err.value)
        return str(err.value)

    assert error(4) == (f"corpus has 2 examples after filtering, fewer than one batch (4): the held-out filter "
                        f"dropped 6 of the 8 examples read from {path}, as they contain sentences of evaluated tasks "
                        "(STS12: 6, STSBenchmark-dev: 6, STSBenchmark: 3), which training must never see; train on "
                        "text of no evaluated task, or hold out only the tasks you will evaluate: "
                        "+data.held_out_tasks=[TASK,...] (task names or groups: sts, transfer, clustering)")
    assert error(16).endswith("must never see; add data or lower data.batch_size (the files give 8 examples)")
    assert error(4, held_out_tasks=["STSBenchmark-dev"]).endswith(
        "to train on this text, remove the tasks it shares sentences with (STSBenchmark-dev) from "
        "data.held_out_tasks and report their scores as contaminated")
    assert error(9, held_out_tasks=[]) == ("corpus has 8 examples after filtering, fewer than one batch (9); add data "
                                           "or lower data.batch_size")
    sick = TripletDataModule("downstream/SICK/SICK_train.txt", format="sick", batch_size=512,
                             data_root=str(real_data_root), cache_dir=str(tmp_path / "c"), pretokenize=False)
    with pytest.raises(DataError) as err:
        sick.setup("fit")
    assert str(err.value).endswith(
        "(SICK-E: 494, SICKRelatedness: 486), which training must never see; to train on SICK, use data=sick_triplets "
        "(it holds out the STS tasks only; the SICK-R score is then reported as contaminated); add data or lower "
        "data.batch_size (the files give 494 examples)")


# -- pre-tokenizing in worker processes ------------------------------------------------------------------------------


def test_worker_processes_write_the_ids_of_the_main_process(tiny_bert, tmp_path, monkeypatch):
    from promptemb.data import pretokenized
    from promptemb.data.pretokenized import pretokenized_corpus
    from promptemb.data.tokenizing_workers import TokenizingWorkers
    from promptemb.lightning_modules.promptbert import PromptBERTSup

    tokenization = PromptBERTSup(str(tiny_bert)).sentence_tokenization()
    path = tmp_path / "nli.csv"
    rows = [(f"premise {i} about item {i * 7 % 13}", f"entailed {i}", f"contradicted {'long ' * (i % 9)}{i}")
            for i in range(2500)]
    path.write_text("sent0,sent1,hard_neg\n" + "".join(",".join(r) + "\n" for r in rows))
    monkeypatch.setattr(corpus_tables, "WRITE_BATCH", 700)  # record batches of 700 rows, 4 of them
    corpus = corpus_table(CorpusSource("nli_csv", (path,)), tmp_path / "cache")
    monkeypatch.setattr(pretokenized, "PARALLEL_FROM_EXAMPLES", 1)
    parallel = pretokenized_corpus(corpus, tokenization, tmp_path / "parallel", num_proc=3)
    here = pretokenized_corpus(corpus, tokenization, tmp_path / "here", num_proc=1)
    for k in range(3):
        assert parallel.data.column(f"ids{k}").equals(here.data.column(f"ids{k}"))
        assert list(here[f"ids{k}"]) == tokenization([row[k] for row in rows])
    with TokenizingWorkers(tokenization.sentence_ids(), 2) as workers:
        assert len(list(workers.map([[["a b"]], [["c"]]]))) == 2  # both serving
        os.kill(workers.workers[0].pid, signal.SIGINT)  # Ctrl-C reaches the group: the parent answers it, not a worker
        assert [offsets.tolist() for ((offsets, _),) in workers.map([[["a"]], [["b"]], [["c"]]])] == [[0, 1]] * 3
    with TokenizingWorkers(tokenization.sentence_ids(), 2) as workers:  # a worker that dies is an error, not a hang
        workers.workers[1].kill()
        with pytest.raises(OSError, match=r"pre-tokenizing worker \d+ ended \(exit -9\)"):
            list(workers.map([[["a"]], [["b"]], [["c"]]]))
