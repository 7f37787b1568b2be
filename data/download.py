"""Download the data files hosted on the Hugging Face Hub, pinned and verified, cached, installed atomically.

    python -m promptemb.data.download --dest DIR [--revision REV] [--sha256 HEX] [--cache-dir DIR]

1. A source (data/sources.yaml: repo, revision, file name, sha256, line count) is fetched with
   `huggingface_hub.hf_hub_download` into a staging folder in the cache (HF_ENDPOINT selects a mirror, HF_TOKEN
   authenticates), its sha256 and line count are checked, and only then is the file renamed into the cache; a cached
   file that still verifies is reused without touching the network. A failed check leaves nothing behind.
2. The SentEval archive is unpacked into a temporary folder beside DEST (tar members outside the folder are refused).
3. Every file of the task registry is verified against its sha256 there; only then is the folder renamed to
   DEST/downstream. A failure leaves DEST as it was.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import yaml

from promptemb.common.errors import ConfigError, DataError, exit_on_user_error
from promptemb.data.checksums import count_lines, sha256_file
from promptemb.data.tasks import REGISTRY_FILE, load_registry

log = logging.getLogger(__name__)
SOURCES_FILE = Path(__file__).with_name("sources.yaml")
DEFAULT_CACHE = Path(os.environ.get("PROMPTEMB_CACHE", Path.home() / ".cache" / "promptemb"))
SOURCE_FIELDS = ("repo_id", "repo_type", "revision", "filename", "sha256", "lines")


def load_source(name: str = "senteval") -> dict:
    with SOURCES_FILE.open(encoding="utf-8") as handle:
        sources = yaml.safe_load(handle)
    if name not in sources:
        raise ConfigError(f"unknown download source {name!r}; valid: {', '.join(sources)}")
    return sources[name]


def verification_error(path: Path, source: dict) -> str | None:
    """Why `path` is not the pinned file (one line), or None when its sha256 and line count match."""
    label = f"{source['repo_id']}/{source['filename']}@{source['revision']}"
    expected = source.get("sha256")
    if expected and (actual := sha256_file(path)) != expected:
        return (f"checksum mismatch for {label}: expected sha256 {expected}, got {actual}; the download is corrupt or "
                "the file changed upstream")
    lines = source.get("lines")
    if lines is not None and (actual_lines := count_lines(path)) != int(lines):
        return (f"line count mismatch for {label}: expected {int(lines):,} lines, got {actual_lines:,}; the download "
                "is truncated or the file changed upstream")
    return None


def cache_path(source: dict, cache_dir: Path) -> Path:
    repo = source["repo_id"].replace("/", "--")
    return cache_dir / f"{source['repo_type']}s--{repo}" / str(source["revision"]) / source["filename"]


def fetch(source: dict, cache_dir: Path = DEFAULT_CACHE, progress: bool = True) -> Path:
    """A verified cached copy of one Hub-hosted `source` (download it first if needed)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    missing = [field for field in SOURCE_FIELDS if field not in source]
    if missing:
        raise ConfigError(f"download source lacks {', '.join(missing)}; see data/sources.yaml")
    target = cache_path(source, cache_dir)
    if target.is_file() and verification_error(target, source) is None:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".part", dir=cache_dir))
    try:
        if not progress:
            disable_progress_bars()
        try:
            downloaded = Path(hf_hub_download(repo_id=source["repo_id"], filename=source["filename"],
                                              repo_type=source["repo_type"], revision=str(source["revision"]),
                                              local_dir=staging))
        except Exception as err:  # HTTP, offline mode, missing entry, disk: all one line for the user
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DataError(f"could not download {source['filename']} from {source['repo_id']}@{source['revision']} "
                            f"({reason[:200]}); check the network, or set HF_ENDPOINT to a mirror") from None
        finally:
            if not progress:
                enable_progress_bars()
        problem = verification_error(downloaded, source)
        if problem:
            raise DataError(problem)
        if not source.get("sha256"):
            log.warning("%s/%s@%s is not pinned by sha256 (got %s): pin it in data/sources.yaml", source["repo_id"],
                        source["filename"], source["revision"], sha256_file(downloaded))
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(downloaded, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _find_downstream(folder: Path, marker: str) -> Path:
    for candidate in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
        if (candidate / marker).is_file():
            return candidate
    raise DataError(f"the archive has no {marker}; it is not the SentEval evaluation archive")


def install_senteval(
    dest: Path,
    revision: str | None = None,
    sha256: str | None = None,
    cache_dir: Path = DEFAULT_CACHE,
    registry_file: Path = REGISTRY_FILE,
    progress: bool = True,
) -> Path:
    """Download (or reuse) the archive and install its verified `downstream/` folder under `dest`. `revision` /
    `sha256` override data/sources.yaml's pins."""
    source = load_source()
    if revision:
        source = {**source, "revision": revision, "sha256": sha256}
    elif sha256:
        source = {**source, "sha256": sha256}
    archive = fetch(source, cache_dir, progress)
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
                    raise DataError(f"checksum mismatch for {inner} in {archive.name}: expected sha256 {expected}, "
                                    f"got {actual}")
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
    parser.add_argument("--revision", default=None, help="Hub revision of the archive (default: data/sources.yaml)")
    parser.add_argument("--sha256", default=None, help="expected sha256 of the archive at that revision")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    final = install_senteval(args.dest, args.revision, args.sha256, args.cache_dir)
    print(f"installed {final}; now export PROMPTEMB_DATA={args.dest}")


if __name__ == "__main__":
    main()
