"""Download the SentEval evaluation data into `DEST/downstream`, checksummed, cached, installed atomically.

    python -m data.download --dest DIR [--url URL] [--sha256 HEX] [--cache-dir DIR]

1. The archive is streamed to a temporary file in the cache (progress bar), its sha256 checked when one is known,
   then renamed into the cache; a cached archive is reused without touching the network.
2. It is unpacked into a temporary folder beside DEST (tar members outside the folder are refused).
3. Every file of the task registry is verified against its sha256 there; only then is the folder renamed to
   DEST/downstream. A failure leaves DEST as it was.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from common.errors import DataError, exit_on_user_error
from data.checksums import sha256_file
from data.tasks import REGISTRY_FILE, load_registry

SOURCES_FILE = Path(__file__).with_name("sources.yaml")
DEFAULT_CACHE = Path(os.environ.get("PROMPTEMB_CACHE", Path.home() / ".cache" / "promptemb"))


def load_source(name: str = "senteval") -> dict:
    with SOURCES_FILE.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)[name]


def fetch(url: str, cache_dir: Path, sha256: str | None = None, progress: bool = True) -> Path:
    """Return a cached copy of `url`, downloading it first if needed; verify `sha256` when given."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    target = cache_dir / f"{key}-{Path(url.split('?')[0]).name or 'download'}"
    if target.is_file() and (sha256 is None or sha256_file(target) == sha256):
        return target
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=cache_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {target.name}",
                      disable=not progress) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
                    bar.update(len(block))
        if sha256 is not None and (actual := sha256_file(tmp)) != sha256:
            raise DataError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {actual}; "
                            "the download is corrupt or the file changed upstream")
        os.replace(tmp, target)
    except (urllib.error.URLError, OSError) as err:
        raise DataError(f"could not download {url}: {err}; check the network or pass --url to a mirror") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _find_downstream(folder: Path, marker: str) -> Path:
    for candidate in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
        if (candidate / marker).is_file():
            return candidate
    raise DataError(f"the archive has no {marker}; it is not the SentEval evaluation archive")


def install_senteval(
    dest: Path,
    url: str | None = None,
    sha256: str | None = None,
    cache_dir: Path = DEFAULT_CACHE,
    registry_file: Path = REGISTRY_FILE,
    progress: bool = True,
) -> Path:
    """Download (or reuse) the archive and install its verified `downstream/` folder under `dest`."""
    source = load_source()
    url = url or source["url"]
    sha256 = sha256 or source["sha256"]
    archive = fetch(url, cache_dir, sha256, progress)
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".senteval-", dir=dest))
    try:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(staging, filter="data")
        except (tarfile.TarError, OSError) as err:
            raise DataError(f"could not unpack {archive}: {err}; delete it and download again") from None
        downstream = _find_downstream(staging, source["marker"])
        registry = load_registry(Path(registry_file))
        for spec in registry.values():
            for relative, expected in spec.files().items():
                inner = Path(relative).relative_to("downstream")
                path = downstream / inner
                if not path.is_file():
                    raise DataError(f"the archive lacks {inner} (needed by task {spec.name})")
                if (actual := sha256_file(path)) != expected:
                    raise DataError(f"checksum mismatch for {inner} in {url}: expected sha256 {expected}, got {actual}")
        final = dest / "downstream"
        if final.exists():
            shutil.rmtree(final)
        os.replace(downstream, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Download and verify the SentEval STS evaluation data.")
    parser.add_argument("--dest", required=True, type=Path, help="data root to create (then set PROMPTEMB_DATA)")
    parser.add_argument("--url", default=None, help="archive URL (default: data/sources.yaml)")
    parser.add_argument("--sha256", default=None, help="expected sha256 of the archive")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    final = install_senteval(args.dest, args.url, args.sha256, args.cache_dir)
    print(f"installed {final}; now export PROMPTEMB_DATA={args.dest}")


if __name__ == "__main__":
    main()
