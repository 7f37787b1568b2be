"""Scripts write into a fresh folder by default and refuse a non-empty one: committed results are never replaced."""

import os
import subprocess
import sys

import pytest

from promptemb.common.errors import ConfigError
from promptemb.common.output_dirs import fresh_output_dir
from tests.conftest import REPO


def test_fresh_output_dir_default_is_new_and_a_non_empty_folder_is_refused(tmp_path):
    first = fresh_output_dir(None, "search", log_dir=tmp_path)
    second = fresh_output_dir(None, "search", log_dir=tmp_path)
    assert first.parent == tmp_path / "search" and first != second and not first.exists()
    assert fresh_output_dir(tmp_path / "new", "search") == tmp_path / "new"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "ditto_heads.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"output folder .*full is not empty; .* --overwrite"):
        fresh_output_dir(tmp_path / "full", "search")
    assert fresh_output_dir(tmp_path / "full", "search", overwrite=True) == tmp_path / "full"


def run(args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("script", "option", "committed"),
                         [("scripts/ditto_head_search.py", [], "results/ditto_head_search"),
                          ("scripts/export_roundtrip.py", ["--ckpt", "x.ckpt", "--out", "exp"],
                           "results/export_roundtrip")])
def test_scripts_refuse_committed_results_before_any_work(script, option, committed, tmp_path):
    flag = "--output-dir" if "ditto" in script else "--results"
    before = {path: path.read_bytes() for path in (REPO / committed).iterdir()}
    proc = run([str(REPO / script), *option, flag, str(REPO / committed)], cwd=tmp_path)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is not empty" in errors[0], proc.stderr
    assert {path: path.read_bytes() for path in (REPO / committed).iterdir()} == before


def test_ditto_head_search_default_writes_a_new_folder(mini_data, tiny_bert, tmp_path):
    root, registry = mini_data
    work = tmp_path / "work"
    work.mkdir()
    args = [str(REPO / "scripts/ditto_head_search.py"), "--model", str(tiny_bert), "--task", "MINI-B",
            "--task-registry", str(registry), "--data-root", str(root)]
    assert run(args, work).returncode == 0
    assert run(args, work).returncode == 0
    folders = sorted((work / "logs" / "ditto_head_search").iterdir())
    assert len(folders) == 2 and all((f / "ditto_heads.json").is_file() for f in folders)


def test_kill_resume_check_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("results")
    proc = subprocess.run(["bash", str(REPO / "scripts/kill_resume_check.sh"), str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: output folder")
    assert (tmp_path / "keep.txt").read_text() == "results"


def test_research_driver_default_output_is_a_new_folder_under_logs(tiny_bert, real_data_root, tmp_path):
    proc = run(["-m", "promptemb.research.token_bias", "--model", str(tiny_bert), "--data-root", str(real_data_root)],
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (folder,) = (tmp_path / "logs" / "token_bias").iterdir()
    assert (folder / "token_bias.json").is_file()


def test_checkpoint_kill_loop_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("results")
    proc = subprocess.run([sys.executable, str(REPO / "scripts/checkpoint_kill_loop.py"), "--out", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PROMPTEMB_DATA": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.startswith("error: output folder"), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def image_versions(tmp_path, **env):
    """scripts/image_versions.sh (`make image-versions`) with IMAGE_* settings; only its checks that come before any
    pip call are exercised here (the whole command takes 20-40 minutes: docs/benchmarks.md)."""
    return subprocess.run(["bash", str(REPO / "scripts/image_versions.sh")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})


def test_image_versions_stops_when_the_carried_wheels_are_not_prepare_shs(tmp_path):
    (tmp_path / "prepare.sh").write_text("pip download hydra-core==1.3.8 typing_extensions==4.16.0\n")
    proc = image_versions(tmp_path, IMAGE_PREPARE=str(tmp_path / "prepare.sh"), IMAGE_VENV=str(tmp_path / "venv"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("image-versions: FAIL .ci/image-carried.txt is not the wheel list of")
    assert "> typing_extensions==4.16.0" in proc.stderr and "< typing_extensions==4.15.0" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_image_versions_never_deletes_a_folder_that_is_not_a_virtual_environment(tmp_path):
    carried = [line for line in (REPO / ".ci/image-carried.txt").read_text().splitlines()
               if line and not line.startswith("#")]
    (tmp_path / "prepare.sh").write_text("pip download " + " ".join(carried) + "\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "keep.txt").write_text("results")
    proc = image_versions(tmp_path, IMAGE_PREPARE=str(tmp_path / "prepare.sh"), IMAGE_VENV=str(tmp_path / "work"))
    assert proc.returncode == 2
    refusal = f"image-versions: FAIL {tmp_path / 'work'} exists and is not a virtual environment; not deleting it"
    assert proc.stderr.strip() == refusal
    assert (tmp_path / "work" / "keep.txt").read_text() == "results"
