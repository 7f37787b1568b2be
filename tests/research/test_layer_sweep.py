"""The layer sweep scores every layer set from one forward per input form, equal to scoring each pooler alone."""

import json

import pytest

from promptemb.common.errors import ConfigError
from promptemb.data.fit_corpora import Corpora
from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_pooler
from promptemb.research import layer_sweep
from promptemb.research.task_groups import StsTaskGroup, build_task_group

PROMPT = 'This sentence : "[X]" means [MASK] .'


@pytest.fixture()
def group(mini_data):
    root, registry = mini_data
    specs = load_registry(registry)
    return StsTaskGroup(get_tasks(["MINI12", "MINI-B"], specs), root, Corpora(root, specs))


def test_parse_layer_sets():
    assert layer_sweep.parse_layer_set("1+2+L", 6) == (1, 2, 6)
    assert layer_sweep.parse_layer_set("L+0+-2", 6) == (0, 5, 6)
    with pytest.raises(ConfigError, match="layer 7 is out of range for a model with 6 layers"):
        layer_sweep.parse_layer_set("1+7", 6)
    with pytest.raises(ConfigError, match="malformed"):
        layer_sweep.parse_layer_set("1++2", 6)
    with pytest.raises(ConfigError, match="names a layer twice"):
        layer_sweep.parse_layer_set("6+L", 6)
    assert layer_sweep.sweep_layer_sets(2, True, ["0+1+L", "1+2"]) == [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2),
                                                                       (0, 1, 2)]
    with pytest.raises(ConfigError, match="has no layer argument to sweep"):
        layer_sweep.layer_argument("sbert_wk")


def test_sweep_equals_each_pooler_alone_from_one_forward_per_form(tiny_bert, group, tmp_path):
    encoder = Encoder(str(tiny_bert), batch_size=3, progress=False)
    sweep = layer_sweep.run_sweep(encoder, group, ["mean", "mask", "avg_idf"], pairs=True, combos=["1+2+L"],
                                  template=Template(PROMPT))
    unique = evaluate_sts(encoder, group.tasks, group.root, [build_pooler("mean")])["unique_sentences"]
    assert sweep["forward_sequences"] == 2 * unique  # plain once + templated once, every layer at once
    assert sweep["needs_layers"] == [0, 1, 2, 3]
    rows = sweep["rows"]
    assert sum(row["pooler"] == "mean" for row in rows.values()) == 4 + 6 + 1  # singles, pairs, 1+2+3
    assert sum(row["pooler"] == "mask" for row in rows.values()) == 4  # one-layer pooler: singles only
    assert "avg_idf[1+2+3](T)" in rows
    for label, pooler in [("mean[1+3]", build_pooler("mean", layers=[1, 3])),
                          ("mean[1+2+3]", build_pooler("mean", layers=[1, 2, -1])),
                          ("mask[2]", build_pooler("mask", layer=2)),
                          ("avg_idf[0+2](T)", build_pooler("avg_idf", layers=[0, 2]))]:
        alone = evaluate_sts(encoder, group.tasks, group.root, [pooler], ScoringOptions(Template(PROMPT)))["scores"]
        assert rows[label]["scores"] == pytest.approx(next(iter(alone.values())), abs=1e-9)
    written = layer_sweep.write_sweep(sweep, tmp_path, encoder, group, "tiny", {"template": PROMPT})
    assert {path.name for path in written} >= {"layer_sweep.json", "layer_sweep.md", "layer_sweep_curve.png",
                                               "layer_sweep_pairs_mean.png", "layer_sweep_tasks_mask.png"}
    record = json.loads((tmp_path / "layer_sweep.json").read_text())
    assert record["provenance"]["forward_sequences"] == 2 * unique
    assert record["rows"]["mean[1+3]"] == {"pooler": "mean", "layers": [1, 3]}
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in written if path.suffix == ".png")


def test_cli_rejects_a_layer_beyond_the_model(tiny_bert, mini_data, tmp_path, capsys):
    root, registry = mini_data
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        layer_sweep.main(["--model", str(tiny_bert), "--tasks", "MINI-B", "--task-registry", str(registry),
                          "--data-root", str(root), "--combos", "1+9", "--output-dir", str(out)])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err  # (transformers may draw a weight-loading progress bar before it)
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: layer 9 is out of range for a model with 3 layers; valid: 0 (embeddings) .. 3, or -4 .. -1"]
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"^unknown evaluation family 'retrieval'; "):
        build_task_group("retrieval")


def test_a_task_of_another_family_is_refused(real_data_root):
    with pytest.raises(ConfigError, match=r"task\(s\) agnews are not sts tasks; pass --family"):
        build_task_group("sts", ["STS12", "agnews"], str(real_data_root))
    assert build_task_group("clustering", None, str(real_data_root)).metric == "clustering accuracy x100"


def test_first_last_sweeps_the_same_layer_pairs_as_mean(tiny_bert, group):
    """first_last is mean pooling over two layers: its pair heatmap is the mean pair heatmap, cell for cell."""
    encoder = Encoder(str(tiny_bert), batch_size=3, progress=False)
    rows = layer_sweep.run_sweep(encoder, group, ["mean", "first_last"], pairs=True, combos=[])["rows"]
    pairs = [label.removeprefix("mean") for label in rows if label.startswith("mean[")]
    assert len(pairs) == 4 + 6
    for cell in pairs:
        assert rows[f"first_last{cell}"]["scores"] == rows[f"mean{cell}"]["scores"]
