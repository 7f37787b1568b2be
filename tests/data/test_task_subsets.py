"""`subset:` in a task record: a fixed subset of a verified file's scored pairs (STSBenchmark-every10,
STSBenchmark-dev-every5)."""

from __future__ import annotations

import pytest
import yaml

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.readers import read_stsb
from promptemb.data.tasks import load_registry
from tests.helpers import STSB_ROWS, write_mini_senteval


def registry_with(tmp_path, **subsets):
    """The mini registry plus one MINI-B task per keyword, each with that `subset` record and `pairs`."""
    path = write_mini_senteval(tmp_path)
    records = yaml.safe_load(path.read_text())
    for name, (subset, pairs) in subsets.items():
        records["tasks"][name] = {**records["tasks"]["MINI-B"], "subset": subset, "pairs": pairs}
    path.write_text(yaml.safe_dump(records, sort_keys=False))
    load_registry.cache_clear()
    return load_registry(path)


def test_subset_keeps_every_kth_pair_in_file_order(tmp_path):
    registry = registry_with(tmp_path, STEP2=({"of": 3, "step": 2}, 2), FIRST2=({"of": 3, "count": 2}, 2),
                             FROM1=({"of": 3, "start": 1, "step": 5}, 1), ALL=({"of": 3}, 3))
    full = read_stsb(tmp_path / "downstream/STS/STSBenchmark/sts-test.csv", "test")
    expected = {"STEP2": [0, 2], "FIRST2": [0, 1], "FROM1": [1], "ALL": [0, 1, 2]}
    for name, rows in expected.items():
        pairs = registry[name].load(tmp_path)
        assert pairs.sentences1 == [full.sentences1[i] for i in rows]
        assert pairs.sentences2 == [full.sentences2[i] for i in rows]
        assert pairs.gold == [full.gold[i] for i in rows]


def test_subset_checks_the_whole_file_first(tmp_path):
    registry = registry_with(tmp_path, WRONG=({"of": len(STSB_ROWS) + 1, "step": 2}, 2),
                             COUNT=({"of": 3, "step": 2}, 3))
    with pytest.raises(DataError, match=r"task WRONG: read 3 scored pairs, expected 4 before taking its subset"):
        registry["WRONG"].load(tmp_path)
    with pytest.raises(DataError, match="task COUNT: read 2 scored pairs, expected 3"):
        registry["COUNT"].load(tmp_path)


@pytest.mark.parametrize("subset", [{"step": 2}, {"of": 3, "step": 0}, {"of": 3, "stride": 2}, {"of": 3, "start": 3},
                                    {"of": 3, "count": True}, [0, 2]])
def test_bad_subset_is_a_config_error(tmp_path, subset):
    registry = registry_with(tmp_path, BAD=(subset, 2))
    with pytest.raises(ConfigError, match="task BAD: subset"):
        registry["BAD"].load(tmp_path)


def test_stsb_every10_is_pairs_0_10_20_of_the_test_split(real_data_root):
    load_registry.cache_clear()
    registry = load_registry()
    subset, full = registry["STSBenchmark-every10"].load(real_data_root), registry["STSBenchmark"].load(real_data_root)
    assert len(subset) == 138 and len(full) == 1379
    assert subset.gold == full.gold[::10] and subset.sentences1 == full.sentences1[::10]
    assert subset.sentences2 == full.sentences2[::10]


def test_stsb_dev_every5_is_pairs_0_5_10_of_the_dev_split(real_data_root):
    load_registry.cache_clear()
    registry = load_registry()
    subset = registry["STSBenchmark-dev-every5"].load(real_data_root)
    full = registry["STSBenchmark-dev"].load(real_data_root)
    assert len(subset) == 300 and len(full) == 1500
    assert subset.gold == full.gold[::5] and subset.sentences1 == full.sentences1[::5]
    assert subset.sentences2 == full.sentences2[::5]
