"""Template search: greedy steps, every score equal to scoring the template alone, ranked outputs, a registered
winner that evaluate.py's config accepts, one-line errors for bad candidate files."""

import json
import re
import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir

from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_pooler
from promptemb.research import template_search
from promptemb.research.template_search import SearchSpace, greedy_search
from tests.conftest import REPO

CANDIDATES = {"slots": {"prefix": ['This sentence : "', 'The text "'], "sentence": ["[X]"],
                        "relation": ['" means [MASK] .', '" is [MASK] .']},
              "search_order": ["relation", "prefix"]}


def test_greedy_search_keeps_each_slots_best():
    space = SearchSpace({"a": ["1", "2", "3"], "b": ["x", "y"]}, ["a", "b"])
    values = {"1x": 1.0, "2x": 5.0, "3x": 2.0, "2y": 7.0, "1y": 100.0}  # 1y is never reached greedily
    calls = []

    def score(text):
        calls.append(text)
        return {"score": values[text]}

    scored, steps = greedy_search(space, score)
    assert calls == ["1x", "2x", "3x", "2y"]  # 2x is not scored twice
    assert [step["chosen"] for step in steps] == ["2", "y"] and steps[-1]["template"] == "2y"
    assert [entry["template"] for entry in template_search.ranked(scored)] == ["2y", "2x", "3x", "1x"]


def test_search_on_tiny_bert_registers_a_usable_winner(tiny_bert, mini_data, tmp_path, capsys):
    root, registry = mini_data
    candidates = tmp_path / "candidates.yaml"
    candidates.write_text(yaml.safe_dump(CANDIDATES))
    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    out = tmp_path / "out"
    template_search.main(["--candidates", str(candidates), "--model", str(tiny_bert), "--tasks", "MINI-B", "MINI12",
                          "--task-registry", str(registry), "--data-root", str(root), "--output-dir", str(out),
                          "--register", "searched", "--configs-dir", str(configs)])
    record = json.loads((out / "template_search.json").read_text())
    ranking = record["ranking"]
    assert len(ranking) == 3 and [e["rank"] for e in ranking] == [1, 2, 3]
    assert [e["score"] for e in ranking] == sorted((e["score"] for e in ranking), reverse=True)
    encoder = Encoder(str(tiny_bert), progress=False)
    tasks = get_tasks(["MINI-B", "MINI12"], load_registry(registry))
    for entry in ranking:
        alone = evaluate_sts(encoder, tasks, root, [build_pooler("mask")], ScoringOptions(Template(entry["template"])))
        assert entry["score"] == pytest.approx(alone["scores"]["mask"]["avg"], abs=1e-9)
        assert entry["pearson"] == pytest.approx(alone["pearson"]["mask"]["avg"], abs=1e-9)
    assert record["best"]["template"] == ranking[0]["template"]
    assert (out / "template_search.png").read_bytes()[:4] == b"\x89PNG"
    with initialize_config_dir(str(configs), version_base="1.3"):
        assert compose("eval", overrides=["template=searched"]).template.text == ranking[0]["template"]
        pair = compose("train", overrides=["template=searched_pair"]).model.templates
        assert list(pair) == [ranking[0]["template"], ranking[1]["template"]]
    with pytest.raises(SystemExit):  # the name is taken now: refused before any encoding
        template_search.main(["--candidates", str(candidates), "--register", "searched", "--configs-dir",
                              str(configs), "--output-dir", str(tmp_path / "again")])
    assert "already exists" in capsys.readouterr().err and not (tmp_path / "again").exists()


@pytest.mark.parametrize("content, message", [
    ({"slots": {"prefix": [], "sentence": ["[X] [MASK]"]}}, "slot 'prefix' has an empty candidate list"),
    ({"slots": {}}, "has no slots"),
    ({"slots": {"a": ["[X] [MASK]"]}, "search_order": ["b"]}, "search_order names unknown slot"),
    ({"slots": {"a": ["no slot here"]}}, "has 0 '\\[X\\]' slots"),
])
def test_bad_candidate_files_are_one_line_errors(tmp_path, capsys, content, message):
    candidates = tmp_path / "c.yaml"
    candidates.write_text(yaml.safe_dump(content))
    with pytest.raises(SystemExit) as exit_info:
        template_search.main(["--candidates", str(candidates), "--output-dir", str(tmp_path / "out")])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert re.search(message, err)
    assert not (tmp_path / "out").exists()
