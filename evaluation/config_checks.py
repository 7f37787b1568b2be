"""evaluate.py's config, checked once before the scoring stack is imported: its own keys (`EvaluateSettings`), the
backbone, a single template, the device, input/output files and the model files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig
from pydantic import BaseModel

from promptemb.common.bounds import AtLeastOne, Seed
from promptemb.common.cli import split_override
from promptemb.common.errors import ConfigError
from promptemb.common.run_folder import nothing_left_on_user_error
from promptemb.common.validation import (
    check_device,
    check_readable_file,
    check_settings,
    check_writable_dir,
    resolved,
)
from promptemb.encoder.loading import check_model_source
from promptemb.encoder.settings import check_backbone, check_template


class EvaluateSettings(BaseModel):
    """evaluate.py's top-level keys (`backbone` is checked against `Encoder`)."""

    mode: str
    data_root: str | None
    task_name: str
    output_dir: str
    paths: dict
    backbone: dict
    template: dict
    tasks: list[str]
    task_registry: str | None
    poolers: list[str]
    pooler_args: dict
    post: list[str]
    post_args: dict
    fit_corpus: str
    analysis: bool
    dims: list[AtLeastOne]
    max_sentence_tokens: AtLeastOne | None
    seed: Seed
    allow_unverified_weights: bool
    progress: bool
    pooler: str
    input: str | None
    output: str | None


def check_evaluate_composition(container: dict) -> None:
    """The same for evaluate.py: its settings, the backbone and a single template."""
    check_template(container, None)
    check_settings(container, EvaluateSettings)
    check_backbone(container)


def _check_evaluate(cfg: DictConfig) -> None:
    container = resolved(cfg)
    check_evaluate_composition(container)
    backbone = container.get("backbone") or {}
    check_device("backbone.device", str(backbone.get("device", "auto")))
    if container.get("task_registry"):
        check_readable_file("task_registry", container["task_registry"])
    if container.get("mode") == "encode":
        if container.get("input"):
            check_readable_file("input", container["input"])
        if container.get("output"):
            output = Path(container["output"])
            if output.is_dir():
                raise ConfigError(f"output={str(output)!r} is a directory; pass a file name such as emb.npy")
            check_writable_dir("output", output.parent)
    else:
        check_writable_dir("output_dir", container["output_dir"])
    if isinstance(name := backbone.get("name_or_path"), str):
        check_model_source(name)
        if backbone.get("revision") and (name.startswith("package:") or Path(name).expanduser().exists()):
            raise ConfigError(f"backbone.revision={backbone['revision']} selects a version of a Hugging Face Hub "
                              f"model, but {name} is local: drop backbone.revision")


def check_evaluate_config(cfg: DictConfig) -> None:
    """Everything about an evaluate.py config that can be refuted before a model or a data file is loaded."""
    with nothing_left_on_user_error():
        _check_evaluate(cfg)


#: Keys only one mode reads, and the key the other mode reads instead (None: nothing corresponds).
MODE_ONLY_KEYS = {
    "encode": {"pooler": "poolers=[NAME]", "input": None, "output": None},
    "score": {"poolers": "pooler=NAME", "post": None, "post_args": None, "tasks": None, "analysis": None,
              "transfer_args": None, "clustering_args": None, "dims": None},
}


def check_mode_keys(default_mode: str) -> Callable[[list[str]], None]:
    """The command-line check that refuses, in one line, a key of the other mode (`pooler=mask` in score mode is
    otherwise accepted and ignored: scoring reads `poolers`). `default_mode`: the mode the entry point's config
    sets when the command line does not."""

    def check(argv: list[str]) -> None:
        overrides = [split_override(arg) for arg in argv if not arg.startswith("-") and "=" in arg]
        mode = next((value for _, key, value in reversed(overrides) if key == "mode"), default_mode)
        for other_mode, keys in MODE_ONLY_KEYS.items():
            if other_mode == mode:
                continue
            for _, key, _ in overrides:
                key = key.split(".", 1)[0]  # `+transfer_args.batch_size=...` is a transfer_args key
                if key in keys:
                    instead = f"; in {mode} mode write {keys[key]}" if keys[key] else ""
                    raise ConfigError(f"{key}= is read in {other_mode} mode only and this is {mode} mode (it "
                                      f"would be ignored){instead}")

    return check
