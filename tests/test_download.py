"""The SentEval downloader against a local HTTP server on 127.0.0.1 serving an archive built from fixtures."""

import hashlib
import http.server
import tarfile
import threading
from pathlib import Path

import pytest

from common.errors import DataError
from data.download import install_senteval, main
from data.tasks import load_registry


class Server:
    def __init__(self, directory: Path):
        counts = self.counts = {}

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(directory), **kwargs)

            def do_GET(self):
                counts[self.path] = counts.get(self.path, 0) + 1
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def build_archive(data_root: Path, archive: Path, corrupt: str | None = None) -> str:
    """Tar the fixture `downstream/` folder nested as SimCSE's archive does; return the archive's sha256."""
    if corrupt:
        path = data_root / corrupt
        path.write_text(path.read_text() + "tampered\n")
    with tarfile.open(archive, "w") as tar:
        tar.add(data_root / "downstream", arcname="SentEval/data/downstream")
    return hashlib.sha256(archive.read_bytes()).hexdigest()


@pytest.fixture()
def served(mini_data, tmp_path):
    data_root, registry = mini_data
    www = tmp_path / "www"
    www.mkdir()
    digest = build_archive(data_root, www / "senteval.tar")
    with Server(www) as server:
        yield server, registry, digest, www


def test_download_installs_verified_tree_and_caches(served, tmp_path):
    server, registry, digest, _ = served
    dest, cache = tmp_path / "data", tmp_path / "cache"
    url = server.url("senteval.tar")
    final = install_senteval(dest, url, digest, cache, registry, progress=False)
    assert final == dest / "downstream"
    tasks = load_registry(registry)
    assert len(tasks["MINI12"].load(dest)) == tasks["MINI12"].pairs
    assert len(tasks["MINI-SICK"].load(dest)) == 3
    assert server.counts == {"/senteval.tar": 1}
    install_senteval(dest, url, digest, cache, registry, progress=False)
    assert server.counts == {"/senteval.tar": 1}, "a cached archive must not be downloaded again"
    assert not [p for p in dest.iterdir() if p.name.startswith(".")], "staging folder left behind"


def test_archive_checksum_mismatch_leaves_nothing(served, tmp_path):
    server, registry, _, _ = served
    dest, cache = tmp_path / "data", tmp_path / "cache"
    with pytest.raises(DataError, match=r"checksum mismatch for http://127\.0\.0\.1:.*expected sha256 0000"):
        install_senteval(dest, server.url("senteval.tar"), "0" * 64, cache, registry, progress=False)
    assert not dest.exists()
    assert list(cache.iterdir()) == []


def test_corrupt_member_is_refused_before_install(mini_data, tmp_path):
    data_root, registry = mini_data
    www = tmp_path / "www2"
    www.mkdir()
    build_archive(data_root, www / "senteval.tar", corrupt="downstream/SICK/SICK_test_annotated.txt")
    dest = tmp_path / "data"
    with Server(www) as server, pytest.raises(DataError, match=r"checksum mismatch for SICK/SICK_test_annotated\.txt"):
        install_senteval(dest, server.url("senteval.tar"), None, tmp_path / "cache", registry, progress=False)
    assert not (dest / "downstream").exists()


def test_unreachable_url_is_one_clear_line(tmp_path, capsys, monkeypatch):
    with Server(tmp_path) as server:
        url = server.url("missing.tar")
        with pytest.raises(SystemExit) as exit_info:
            main(["--dest", str(tmp_path / "d"), "--url", url, "--cache-dir", str(tmp_path / "c")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: could not download http://127.0.0.1") and "\n" not in err
