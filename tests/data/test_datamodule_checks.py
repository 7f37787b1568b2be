"""The datamodules' own check of a config's corpus files, as train.py's config check runs it: without building the
datamodule (no tokenizer, no trainer), one line naming the key and the path resolved under the data root."""

from __future__ import annotations

import pytest

from promptemb.common.errors import ConfigError, DataError
from promptemb.data.datamodules import TextLinesDataModule, TripletDataModule
from promptemb.training.settings import check_training_data
from tests.training.test_train import WIKI_SAMPLE


@pytest.fixture()
def never_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the check built the datamodule")

    monkeypatch.setattr(TextLinesDataModule, "__init__", refuse)
    monkeypatch.setattr(TripletDataModule, "__init__", refuse)


def test_existing_corpus_files_pass_without_building_the_datamodule(never_built, real_data_root):
    check_training_data({"_target_": "promptemb.data.datamodules.TextLinesDataModule", "files": [WIKI_SAMPLE]},
                        real_data_root)
    check_training_data({"_target_": "promptemb.data.datamodules.TripletDataModule",
                         "file": "downstream/SICK/SICK_train.txt", "format": "sick"}, real_data_root)


def test_missing_corpus_file_is_one_line_under_the_data_root(never_built, real_data_root, tmp_path):
    data = {"_target_": "promptemb.data.datamodules.TextLinesDataModule", "files": [WIKI_SAMPLE, "no/such.txt"]}
    with pytest.raises(ConfigError, match=rf"^data\.files: corpus file {real_data_root}/no/such\.txt does not exist "
                                          rf"\(relative paths are relative to the data root {real_data_root}\)$"):
        check_training_data(data, real_data_root)
    absolute = tmp_path / "nli.csv"
    data = {"_target_": "promptemb.data.datamodules.TripletDataModule", "file": str(absolute), "format": "nli_csv"}
    with pytest.raises(ConfigError, match=rf"^data\.file: corpus file {absolute} does not exist"):
        check_training_data(data, real_data_root)
    absolute.write_text("sent0,sent1\na,b\n")  # a supervised csv without its hard negatives
    with pytest.raises(DataError, match=r"missing column\(s\) hard_neg"):
        check_training_data(data, real_data_root)


def test_a_download_source_stands_for_its_own_file_only(never_built, real_data_root):
    """With `download`, a relative name means the fetched file (fetched when the run starts, not here): any other
    name (`data=wiki1m data.files=[my_corpus.txt]`) would silently train on the download instead; refused."""
    wiki1m = {"_target_": "promptemb.data.datamodules.TextLinesDataModule", "download": "wiki1m"}
    check_training_data({**wiki1m, "files": ["wiki1m_for_simcse.txt"]}, real_data_root)
    for files in (["my_corpus.txt"], ["wiki1m_for_simcse.txt", "wiki1m_for_simcse.txt"]):
        with pytest.raises(ConfigError, match=r"^data\.files=\[.*\] but data\.download=wiki1m fetches "
                                              r"wiki1m_for_simcse\.txt, which a relative name stands for: set "
                                              r"data\.download=null to train on your own files"):
            check_training_data({**wiki1m, "files": files}, real_data_root)
