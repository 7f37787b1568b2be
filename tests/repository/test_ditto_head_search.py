"""The head search scores every layer x head from one forward pass, consistently with the `ditto` pooler."""

import json
import subprocess
import sys

import pytest

from promptemb.data.tasks import get_tasks, load_registry
from promptemb.encoder.model import Encoder
from promptemb.evaluation.sts import evaluate_sts
from promptemb.poolers import build_pooler
from tests.conftest import REPO


def test_grid_entries_equal_ditto_pooler_scores(mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "scripts/ditto_head_search.py", "--model", str(tiny_bert), "--task",
                           "MINI-B", "--task-registry", str(registry), "--data-root", str(root), "--output-dir",
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "+pooler_args.ditto.layer=" in proc.stdout
    record = json.loads((out / "ditto_heads.json").read_text())
    assert (out / "ditto_heads.png").read_bytes()[:4] == b"\x89PNG"
    grid = record["grid_spearman"]
    assert len(grid) == 3 and len(grid[0]) == 4  # tiny BERT: 3 layers x 4 heads
    assert record["provenance"]["forward_sequences"] == record["provenance"]["unique_sentences"]
    encoder = Encoder(str(tiny_bert), attentions=True, progress=False)
    tasks = get_tasks(["MINI-B"], load_registry(registry))
    for layer, head in [(0, 0), (2, 3), (record["best"]["layer"], record["best"]["head"])]:
        score = evaluate_sts(encoder, tasks, root, [build_pooler("ditto", layer=layer, head=head)])["scores"]
        assert score["ditto"]["MINI-B"] == pytest.approx(grid[layer][head], abs=1e-3)
    assert record["best"]["spearman"] == pytest.approx(max(max(row) for row in grid), abs=1e-3)
