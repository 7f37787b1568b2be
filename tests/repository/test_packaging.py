"""`pip install .` (not editable) gives a working install: a wheel is built from a copy of the source tree,
installed into a fresh venv, and its console scripts run from a temporary directory (no checkout on the path).

The venv reuses the test interpreter's installed dependencies through a .pth line (nothing is downloaded); the
wheel is installed with --no-deps. Slow (a build, a scoring run and a one-step training run): `pytest -m slow`.
The builds themselves (a wheel, and the editable wheel `make install` builds) are checked fast: quiet, and the wheel
holds every YAML file of the package folders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO

WIKI_SAMPLE = "training/partial/wiki1m_for_simcse.first11914lines.txt"
SOURCE_PARTS = ("pyproject.toml", "README.md", "LICENSE", "promptemb", "configs", "common", "data", "encoder",
                "poolers", "evaluation", "lightning_modules", "callbacks", "training", "inference", "exporting",
                "postprocessing", "research")


def run(command: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def source_copy(work: Path) -> Path:
    """A clean copy of the source tree: no build/ or egg-info of the checkout leaks into a build."""
    source = work / "source"
    source.mkdir()
    for part in SOURCE_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, source / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, source / part)
    return source


def build_wheel(work: Path, quiet: bool = True) -> tuple[Path, subprocess.CompletedProcess]:
    """The wheel `pip install .` builds from a clean copy of the source tree, and pip's output."""
    built = run([sys.executable, "-m", "pip", "wheel", *(["-q"] if quiet else []), "--no-deps", "--no-build-isolation",
                 str(source_copy(work)), "-w", str(work / "dist")], cwd=work)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel, = (work / "dist").glob("promptemb-*.whl")
    return wheel, built


#: What setuptools prints when a build is not clean (BuildBackendWarning, SetuptoolsDeprecationWarning, ...).
PACKAGING_WARNING = re.compile(r"\w*Warning\b|Package would be ignored")


def test_the_wheel_builds_quietly_and_ships_every_config(tmp_path):
    """`pip install .`: no packaging warning (the config folders are data of `promptemb.configs`, not packages
    setuptools would warn about), and the wheel holds every YAML file the package folders track."""
    import zipfile

    wheel, built = build_wheel(tmp_path, quiet=False)
    assert not PACKAGING_WARNING.search(built.stdout + built.stderr), built.stdout + built.stderr
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".yaml")}
    folders = {"configs", "data", "research"}
    tracked = subprocess.run(["git", "ls-files", "*.yaml"], cwd=REPO, capture_output=True, text=True).stdout.split()
    expected = {f"promptemb/{path}" for path in tracked if path.split("/", 1)[0] in folders}
    assert len(expected) > 60 and shipped == expected


def test_the_editable_install_of_make_install_is_quiet(tmp_path):
    """`make install`'s editable build, with the Makefile's one filter: setuptools' information notice that every
    editable install of a mapped layout prints ("Editable installation.": folders named like the package may shadow
    it) is all it hides; no other warning is printed."""
    makefile = (REPO / "Makefile").read_text()
    setting = re.search(r'PYTHONWARNINGS="([^"]+)" \$\(BIN\)/pip install .* -e ', makefile)
    assert setting and setting.group(1) == "ignore:Editable installation", "the Makefile's install line changed"
    source = source_copy(tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": setting.group(1)}
    built = run([sys.executable, "-c", "import setuptools.build_meta as backend; "
                 f"print(backend.build_editable({str(tmp_path / 'dist')!r}))"], cwd=source, env=env)
    assert built.returncode == 0, built.stderr[-2000:]
    assert built.stdout.strip().endswith(".whl")
    assert not PACKAGING_WARNING.search(built.stdout + built.stderr), built.stdout + built.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding the wheel built from this source tree."""
    work = tmp_path_factory.mktemp("wheel")
    wheel, _ = build_wheel(work)
    venv = work / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       cwd=work).stdout.strip())
    # the test interpreter's dependencies, appended after the venv's own site-packages (a plain path line: the
    # .pth files there, e.g. an editable install of the checkout, are not processed)
    (purelib / "promptemb_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                     str(wheel)], cwd=work)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return venv / "bin"


def shadowing_packages(folder: Path) -> None:
    """A user's own `data/` and `common/` packages in the working directory: importing either fails loudly."""
    for name in ("data", "common", "training"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(f"raise ImportError('a user package {name} was imported')\n")


def clean_env(data_root: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PROMPTEMB_DATA")}
    return {**env, "PROMPTEMB_DATA": str(data_root), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}


@pytest.mark.slow
def test_installed_package_is_self_contained(installed, tmp_path):
    probe = run([str(installed / "python"), "-c",
                 "import importlib.metadata as m, promptemb.common as common, promptemb.configs as configs; "
                 "print(common.__file__); print(configs.CONFIG_DIR); print(m.version('promptemb'))"], cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    module_file, config_dir, version = probe.stdout.split()
    site = str(installed.parent / "lib")
    assert module_file.startswith(site) and config_dir.startswith(site), "imported the checkout, not the install"
    assert (Path(config_dir) / "train.yaml").is_file() and (Path(config_dir) / "experiment").is_dir()
    assert version == "0.1.0"
    for script in ("promptemb-train", "promptemb-evaluate", "promptemb-export", "promptemb-encode", "promptemb-models",
                   "promptemb-mteb"):
        assert (installed / script).is_file()


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_package(installed):
    site = installed.parent / "lib"
    purelib, = site.glob("python*/site-packages")
    record, = purelib.glob("promptemb-*.dist-info/RECORD")
    top_level = {line.split("/", 1)[0] for line in record.read_text().splitlines() if line}
    top_level = {name for name in top_level if not name.endswith(".dist-info") and not name.startswith("..")}
    assert top_level == {"promptemb"}


@pytest.mark.slow
def test_console_scripts_score_and_train_from_any_directory(installed, tiny_bert, real_data_root, tmp_path):
    env = clean_env(real_data_root)
    shadowing_packages(tmp_path)  # run from a directory holding its own data/ and common/ packages
    scored = run([str(installed / "promptemb-evaluate"), f"backbone.name_or_path={tiny_bert}", "tasks=[STSBenchmark]",
                  "poolers=[mean]", "output_dir=scores", "progress=false", "backbone.device=cpu"],
                 cwd=tmp_path, env=env)
    assert scored.returncode == 0, scored.stderr[-3000:]
    results = json.loads((tmp_path / "scores" / "results.json").read_text())
    assert -100 <= results["scores"]["mean"]["STSBenchmark"] <= 100
    assert results["provenance"]["versions"]["promptemb"] == "0.1.0"

    (tmp_path / "lines.txt").write_text("a first line\nand a second one\n")
    encoded = run([str(installed / "promptemb-encode"), f"backbone.name_or_path={tiny_bert}", "pooler=mean",
                   "input=lines.txt", "output=lines.npy", "progress=false", "backbone.device=cpu"],
                  cwd=tmp_path, env=env)
    assert encoded.returncode == 0, encoded.stderr[-3000:]
    assert np.load(tmp_path / "lines.npy").shape == (2, 32)

    trained = run([str(installed / "promptemb-train"), "experiment=quickstart_unsup",
                   f"backbone.name_or_path={tiny_bert}", "debug=fdr", "trainer.accelerator=cpu",
                   "trainer.precision=32-true", "output_dir=run", "data.batch_size=4", "data.num_workers=0",
                   "data.download=null", f"data.files=[{WIKI_SAMPLE}]", "data.max_examples=64",
                   "callbacks.sts_evaluation.final_tasks=[STSBenchmark]"], cwd=tmp_path, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results["scores"]) == {"mask", "avg"}
    assert (tmp_path / "run" / "train.log").is_file(), "Hydra's job log keeps the name train.log"
