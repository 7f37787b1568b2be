"""The settings layer's figures (docs/layout.md, scripts/settings_figures.py), pinned: what names Hydra's config
objects below the command lines, how many lines the checks take, where raw config dicts are still read by key."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from settings_figures import code_lines, config_reads, figures


def test_the_settings_layer_keeps_its_figures():
    """Issue 39's targets that are met stay met: at most two modules below the command lines name Hydra's config
    objects (the bridge and the multirun summary), no raw config dict is read by key on evaluate.py's path and at most
    four elsewhere; the check and run-folder files do not grow past what docs/layout.md measures."""
    now = figures(None)
    assert len(now["config_object_modules"]) <= 2, now["config_object_modules"]
    assert set(now["config_object_modules"]) <= {"common/hydra_bridge.py", "training/trials.py"}
    assert now["config_reads_evaluate_path"] == 0, now["config_reads"]
    assert now["config_reads_total"] <= 4, now["config_reads"]
    assert now["code_lines_total"] <= 1417, now["code_lines"]


def test_the_measures_count_what_they_say():
    text = '"""Doc."""\n\nimport x  # a comment\n\n\ndef f(model: dict, cfg):\n    """Doc\n    two."""\n' \
           '    data = model.get("data") or {}\n    return data["files"], cfg["a"], x["b"], {"c": 1}.get("c")\n'
    assert code_lines(text) == 4
    assert [read for _, read in config_reads(text)] == ["model.get('data')", "cfg['a']", "data['files']"]


def test_the_script_prints_the_figures():
    shown = subprocess.run([sys.executable, str(REPO / "scripts/settings_figures.py")], capture_output=True,
                           text=True, check=True).stdout
    assert "modules below the command lines naming DictConfig/OmegaConf/HydraConfig: 2" in shown
    assert "code lines of the check and run-folder files:" in shown
