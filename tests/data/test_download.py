"""Downloads through huggingface_hub, with `hf_hub_download` replaced by a fake Hub that serves local files (the same
call signature, writing into `local_dir` as the real one does): pinned sha256 and line count checked, cached,
one-line errors, nothing left behind."""

import hashlib
import tarfile
from pathlib import Path

import pytest

from promptemb.common.errors import DataError
from promptemb.data.checksums import count_lines
from promptemb.data.datamodules import TextLinesDataModule
from promptemb.data.download import fetch, install_senteval, load_source, main
from promptemb.data.tasks import load_registry


class FakeHub:
    """Serves `files` {filename: local path} for one repo; counts the downloads."""

    def __init__(self, files: dict[str, Path]):
        self.files = files
        self.calls: list[tuple[str, str, str, str]] = []

    def __call__(self, *, repo_id, filename, repo_type, revision, local_dir, **kwargs):
        self.calls.append((repo_id, filename, repo_type, revision))
        if filename not in self.files:
            raise FileNotFoundError(f"404 Client Error: Entry Not Found for url: .../{filename}\nmore detail")
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / ".cache").mkdir(exist_ok=True)  # the real client keeps metadata there
        target.write_bytes(self.files[filename].read_bytes())
        return str(target)


@pytest.fixture()
def hub(monkeypatch):
    def install(files: dict[str, Path]) -> FakeHub:
        fake = FakeHub(files)
        monkeypatch.setattr("huggingface_hub.hf_hub_download", fake)
        return fake

    return install


def build_archive(data_root: Path, archive: Path, corrupt: str | None = None) -> str:
    """Tar the fixture `downstream/` folder nested as SimCSE's archive does; return the archive's sha256."""
    if corrupt:
        path = data_root / corrupt
        path.write_text(path.read_text() + "tampered\n")
    with tarfile.open(archive, "w") as tar:
        tar.add(data_root / "downstream", arcname="SentEval/data/downstream")
    return hashlib.sha256(archive.read_bytes()).hexdigest()


def text_source(path: Path, sha256: str | None, lines: int | None) -> dict:
    return {"repo_id": "org/data", "repo_type": "dataset", "revision": "abc123", "filename": path.name,
            "sha256": sha256, "lines": lines}


def leftovers(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*")] if cache.exists() else []


def test_count_lines(tmp_path):
    for text, expected in (("", 0), ("a\n", 1), ("a\nb", 2), ("a\r\nb\n\n", 3)):
        (tmp_path / "f").write_bytes(text.encode())
        assert count_lines(tmp_path / "f") == expected


def test_pinned_file_is_fetched_verified_and_cached(hub, tmp_path):
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("one\ntwo\nthree\n")
    fake = hub({"wiki.txt": corpus})
    source = text_source(corpus, hashlib.sha256(corpus.read_bytes()).hexdigest(), 3)
    cache = tmp_path / "cache"
    got = fetch(source, cache, progress=False)
    assert got.read_bytes() == corpus.read_bytes() and cache in got.parents
    assert fake.calls == [("org/data", "wiki.txt", "dataset", "abc123")]
    assert fetch(source, cache, progress=False) == got and len(fake.calls) == 1, "a verified cached copy is reused"
    assert [p for p in leftovers(cache) if p.name.startswith(".")] == [], "staging folder left behind"


@pytest.mark.parametrize(("sha256", "lines", "message"), [
    ("0" * 64, 3, r"^checksum mismatch for org/data/wiki\.txt@abc123: expected sha256 0{64}, got [0-9a-f]{64}; "),
    (None, 4, r"^line count mismatch for org/data/wiki\.txt@abc123: expected 4 lines, got 3; "),
])
def test_wrong_checksum_or_line_count_is_one_line_and_leaves_nothing(hub, tmp_path, sha256, lines, message):
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("one\ntwo\nthree\n")
    hub({"wiki.txt": corpus})
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=message) as err:
        fetch(text_source(corpus, sha256, lines), cache, progress=False)
    assert "\n" not in str(err.value)
    assert leftovers(cache) == []


def test_training_corpus_download_goes_through_the_hub(hub, tmp_path, monkeypatch):
    corpus = tmp_path / "wiki1m_for_simcse.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(10)))
    hub({"wiki1m_for_simcse.txt": corpus})
    monkeypatch.setattr("promptemb.data.datamodules.load_source",
                        lambda name: {**load_source(name), "lines": 10, "sha256": None})
    module = TextLinesDataModule(files=["wiki1m_for_simcse.txt"], download="wiki1m", cache_dir=str(tmp_path / "c"),
                                 batch_size=2, data_root=str(tmp_path))
    assert module.resolve("wiki1m_for_simcse.txt").read_text() == corpus.read_text()


def test_senteval_installs_verified_tree(hub, mini_data, tmp_path):
    data_root, registry = mini_data
    archive = tmp_path / "senteval.tar"
    digest = build_archive(data_root, archive)
    fake = hub({"senteval.tar": archive})
    dest, cache = tmp_path / "data", tmp_path / "cache"
    final = install_senteval(dest, "rev1", digest, cache, registry, progress=False)
    assert final == dest / "downstream"
    assert fake.calls == [("princeton-nlp/datasets-for-simcse", "senteval.tar", "dataset", "rev1")]
    tasks = load_registry(registry)
    assert len(tasks["MINI12"].load(dest)) == tasks["MINI12"].pairs
    assert len(tasks["MINI-SICK"].load(dest)) == 3
    install_senteval(dest, "rev1", digest, cache, registry, progress=False)
    assert len(fake.calls) == 1, "a cached archive must not be downloaded again"
    assert not [p for p in dest.iterdir() if p.name.startswith(".")], "staging folder left behind"


def test_senteval_checksum_mismatch_leaves_nothing(hub, mini_data, tmp_path):
    data_root, registry = mini_data
    archive = tmp_path / "senteval.tar"
    build_archive(data_root, archive)
    hub({"senteval.tar": archive})
    dest, cache = tmp_path / "data", tmp_path / "cache"
    with pytest.raises(DataError, match=r"checksum mismatch for .*senteval\.tar@rev1: expected sha256 0000"):
        install_senteval(dest, "rev1", "0" * 64, cache, registry, progress=False)
    assert not dest.exists() and leftovers(cache) == []


def test_corrupt_member_is_refused_before_install(hub, mini_data, tmp_path):
    data_root, registry = mini_data
    archive = tmp_path / "senteval.tar"
    build_archive(data_root, archive, corrupt="downstream/SICK/SICK_test_annotated.txt")
    hub({"senteval.tar": archive})
    dest = tmp_path / "data"
    with pytest.raises(DataError, match=r"checksum mismatch for SICK/SICK_test_annotated\.txt"):
        install_senteval(dest, None, None, tmp_path / "cache", registry, progress=False)
    assert not (dest / "downstream").exists()


def test_failed_download_is_one_clear_line(hub, tmp_path, capsys):
    hub({})
    with pytest.raises(SystemExit) as exit_info:
        main(["--dest", str(tmp_path / "d"), "--cache-dir", str(tmp_path / "c")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: could not download senteval.tar from princeton-nlp/datasets-for-simcse@main (404")
    assert "\n" not in err and leftovers(tmp_path / "c") == [] and not (tmp_path / "d").exists()
