"""SentEval 'all' protocol: blank gold lines dropped, subsets concatenated, Spearman with averaged ties, checksums."""

import logging
import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.checksums import verify_file
from promptemb.data.readers import read_sick, read_sts_subset, read_stsb
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import SentenceIndex, evaluate_sts, spearman_x100
from promptemb.poolers import build_poolers
from tests.helpers import STS_A, STS_B


def average_ranks(values):
    """1-based ranks; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def hand_spearman_x100(x, y):
    return 100 * pearson(average_ranks(list(x)), average_ranks(list(y)))


def test_spearman_averages_ties_like_scipy():
    predicted = [0.9, 0.1, 0.5, 0.5, 0.7, 0.1, 0.3]
    gold = [5.0, 1.0, 3.5, 3.5, 3.5, 0.0, 2.0]
    assert average_ranks(gold) == [7.0, 2.0, 5.0, 5.0, 5.0, 1.0, 3.0]
    assert spearman_x100(np.array(predicted), np.array(gold)) == pytest.approx(hand_spearman_x100(predicted, gold))
    assert spearman_x100(np.array(predicted), np.array(gold)) == pytest.approx(100 * spearmanr(predicted, gold)[0])


def test_blank_gold_lines_are_dropped(mini_data):
    root, _ = mini_data
    year = root / "downstream/STS/MINI12-en-test"
    pairs = read_sts_subset(year / "STS.input.alpha.txt", year / "STS.gs.alpha.txt", "alpha")
    kept = [row for row in STS_A if row[2]]
    assert len(pairs) == len(kept) == 3
    assert pairs.sentences1 == [a for a, _, _ in kept]
    assert pairs.gold == [float(g) for _, _, g in kept]


def test_year_concatenates_subsets_in_registry_order(mini_data):
    root, registry = mini_data
    task = load_registry(registry)["MINI12"]
    pairs = task.load(root)
    kept = [row for row in STS_A + STS_B if row[2]]
    assert pairs.sentences2 == [b for _, b, _ in kept]
    assert pairs.subsets == ["alpha"] * 3 + ["beta"] * 3


def test_stsb_and_sick_readers_normalise_whitespace(mini_data):
    root, _ = mini_data
    stsb = read_stsb(root / "downstream/STS/STSBenchmark/sts-test.csv", "test")
    assert stsb.sentences1[2] == "the cat sat ." and stsb.gold == [5.0, 1.2, 2.5]
    sick = read_sick(root / "downstream/SICK/SICK_test_annotated.txt", "test")
    assert sick.sentences1 == ["A boy is running", "A man is cooking", "The sun is shining brightly ."]
    assert sick.gold == [4.5, 3.1, 1.2]


def test_score_equals_hand_computation_over_concatenation(mini_data, tiny_bert):
    root, registry = mini_data
    tasks = get_tasks(["MINI12", "MINI-B", "MINI-SICK"], load_registry(registry))
    encoder = Encoder(str(tiny_bert), progress=False)
    result = evaluate_sts(encoder, tasks, root, build_poolers(["mean"]))
    for spec in tasks:
        pairs = spec.load(root)
        emb = encoder.embed(pairs.sentences1 + pairs.sentences2, build_poolers(["mean"]))["mean"]
        n = len(pairs)
        cosines = []
        for i in range(n):
            a, b = emb[i].tolist(), emb[n + i].tolist()
            dot = sum(x * y for x, y in zip(a, b))
            cosines.append(dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)))
        want = hand_spearman_x100(cosines, pairs.gold)
        assert result["scores"]["mean"][spec.name] == pytest.approx(want, abs=1e-6)
    per_task = [result["scores"]["mean"][t.name] for t in tasks]
    assert result["scores"]["mean"]["avg"] == pytest.approx(sum(per_task) / 3)
    assert set(result["details"]["mean"]["MINI12"]["subsets"]) == {"alpha", "beta"}


def test_truncated_sentences_are_counted_and_reported_once_per_task(mini_data, tiny_bert, caplog):
    root, registry = mini_data
    tasks = get_tasks(["MINI12", "MINI-B"], load_registry(registry))
    encoder = Encoder(str(tiny_bert), progress=False)
    limit = 5
    caplog.set_level(logging.WARNING, logger="promptemb.evaluation.encoding_pass")
    result = evaluate_sts(encoder, tasks, root, build_poolers(["mean"]), ScoringOptions(max_sentence_tokens=limit))
    for spec in tasks:
        pairs = spec.load(root)
        unique = set(pairs.sentences1 + pairs.sentences2)
        longer = sum(len(encoder.tokenizer(s, add_special_tokens=False)["input_ids"]) > limit for s in unique)
        assert 0 < longer < len(unique)
        assert result["tasks"][spec.name]["truncated"] == {
            "plain": {"truncated": longer, "sentences": len(unique), "max_tokens": limit}}
        message = f"{spec.name}: {longer} of {len(unique)} sentences longer than {limit} tokens were truncated"
        assert sum(message in record.getMessage() for record in caplog.records) == 1
    caplog.clear()
    evaluate_sts(encoder, tasks, root, build_poolers(["mean"]), ScoringOptions(max_sentence_tokens=limit))
    assert not [record for record in caplog.records if "truncated" in record.getMessage()]  # once per task


def test_sentence_index_deduplicates():
    index = SentenceIndex()
    assert index.add(["a", "b", "a"]).tolist() == [0, 1, 0]
    assert index.add(["b", "c"]).tolist() == [1, 2]
    assert index.sentences == ["a", "b", "c"]


def test_checksum_mismatch(mini_data):
    root, registry = mini_data
    gold = root / "downstream/STS/MINI12-en-test/STS.gs.alpha.txt"
    gold.write_text(gold.read_text().replace("4.8", "4.9"))
    with pytest.raises(DataError, match=r"checksum mismatch for .*STS\.gs\.alpha\.txt: expected sha256"):
        load_registry(registry)["MINI12"].load(root)


def test_missing_file_names_path(tmp_path):
    with pytest.raises(DataError, match=r"missing data file .*nope\.txt"):
        verify_file(tmp_path, "nope.txt", "0" * 64)


@pytest.mark.parametrize(
    ("content", "message"),
    [("only one field\n", r"alpha\.txt:1: expected 2 tab-separated sentences, found 1 fields"),
     ("a\tb\nc\td\te\n", r"alpha\.txt:2: expected 2 tab-separated sentences, found 3 fields"),
     ("a\t \n", r"alpha\.txt:1: empty sentence")],
)
def test_malformed_sts_input(tmp_path, content, message):
    inputs, gold = tmp_path / "STS.input.alpha.txt", tmp_path / "STS.gs.alpha.txt"
    inputs.write_text(content)
    gold.write_text("1.0\n" * content.count("\n"))
    with pytest.raises(DataError, match=message):
        read_sts_subset(inputs, gold, "alpha")


def test_invalid_utf8_names_file_and_line(tmp_path):
    inputs, gold = tmp_path / "STS.input.alpha.txt", tmp_path / "STS.gs.alpha.txt"
    inputs.write_bytes(b"a\tb\nc\td\nthe caf\xe9\tx\n")
    gold.write_text("1.0\n2.0\n3.0\n")
    with pytest.raises(DataError, match=r"STS\.input\.alpha\.txt:3: not valid UTF-8 \(invalid continuation byte: "
                                        r"byte 0xe9 at byte 8 of the line\)"):
        read_sts_subset(inputs, gold, "alpha")


def test_malformed_gold_and_stsb(tmp_path):
    inputs, gold = tmp_path / "in.txt", tmp_path / "gs.txt"
    inputs.write_text("a\tb\nc\td\n")
    gold.write_text("1.0\nhigh\n")
    with pytest.raises(DataError, match=r"gs\.txt:2: gold score 'high' is not a number"):
        read_sts_subset(inputs, gold, "x")
    gold.write_text("1.0\n")
    with pytest.raises(DataError, match=r"1 gold lines but in\.txt has 2 sentence pairs"):
        read_sts_subset(inputs, gold, "x")
    csv = tmp_path / "sts-test.csv"
    csv.write_text("g\tf\t2012\t1\t5.0\tonly a\n")
    with pytest.raises(DataError, match=r"sts-test\.csv:1: expected at least 7 tab-separated fields, found 6"):
        read_stsb(csv, "test")


def test_data_root_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("PROMPTEMB_DATA", raising=False)
    with pytest.raises(DataError, match="no data root set: pass data_root=PATH or export PROMPTEMB_DATA=PATH"):
        resolve_data_root(None)
    with pytest.raises(DataError, match="does not exist"):
        resolve_data_root(tmp_path / "missing")
    monkeypatch.setenv("PROMPTEMB_DATA", str(tmp_path))
    assert resolve_data_root(None) == tmp_path


def test_unknown_task_lists_valid_ones():
    with pytest.raises(ConfigError, match="unknown task STS17; valid tasks: STS12, STS13"):
        get_tasks(["STS17"])


def test_a_registry_files_groups_and_records_are_checked(mini_data):
    """A registry file's own groups expand like the built-in ones (`all`: every group's tasks); a group naming a task
    the file does not hold, and a record without its format, split or main_score, are one line each."""
    _, registry = mini_data
    text = registry.read_text()
    registry.write_text("groups:\n  pairs: [MINI-B, MINI-SICK]\n  years: [MINI12]\n" + text)
    load_registry.cache_clear()
    tasks = load_registry(registry)
    assert [task.name for task in get_tasks(["years", "pairs"], tasks)] == ["MINI12", "MINI-B", "MINI-SICK"]
    assert tasks.groups["all"] == ("MINI-B", "MINI-SICK", "MINI12")
    with pytest.raises(ConfigError, match=r"valid groups: pairs, years, all$"):
        get_tasks(["sts"], tasks)
    registry.write_text("groups:\n  pairs: [MINI-B, STS12]\n" + text)
    load_registry.cache_clear()
    with pytest.raises(ConfigError, match=r"group pairs names 'STS12', which is not one of its tasks$"):
        load_registry(registry)
    registry.write_text("tasks:\n  X: {format: stsb, split: test}\n")
    load_registry.cache_clear()
    with pytest.raises(ConfigError, match=r"task X has no 'main_score'; every record names its format, split and "
                                          r"main_score$"):
        load_registry(registry)
    load_registry.cache_clear()


def test_real_registry_counts_and_checksums(real_data_root):
    """Every registered task on the real data: sha256 verified, the scored-pair counts of SentEval's "all" setting."""
    registry = load_registry()
    expected = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186, "STSBenchmark": 1379,
                "STSBenchmark-dev": 1500, "STSBenchmark-train": 5749, "SICKRelatedness": 4927}
    for name, count in expected.items():
        assert len(registry[name].load(real_data_root)) == count
    assert registry.groups["sts"] == ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
    assert "SMT" not in {s["name"] for s in registry["STS13"].record["subsets"]}
