"""evaluate.py's settings, one object per command: `EvaluateSettings` (configs/eval.yaml) and `EncodeSettings`
(configs/encode.yaml: promptemb-encode, evaluate.py mode=encode), checked once when they are built from the composed
config, before the scoring stack is imported: a wrong value costs a second, not ten.

    settings = EvaluateSettings.model_validate(values, context=run_context)    # the RunContext: its overrides
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, model_validator

from promptemb.common.bounds import AtLeastOne, NonNegativeInt, Seed
from promptemb.common.cli import split_override
from promptemb.common.errors import ConfigError
from promptemb.common.run_context import RunPaths
from promptemb.common.validation import (
    CommandSettings,
    OpenMap,
    check_device,
    check_readable_file,
    check_writable_dir,
    composition_only,
)
from promptemb.data.root import resolve_data_root
from promptemb.encoder.settings import TemplateSettings, check_backbone, check_template
from promptemb.encoder.sources import source_kind


@dataclass
class ScoringSettings:
    """The `scoring` config group (configs/scoring/): evaluate.py's top-level keys, the training callback's keys."""

    poolers: Sequence[str] = ()
    pooler_args: dict | None = field(default_factory=dict)  # null: none
    post: Sequence[str] = ()
    post_args: dict | None = field(default_factory=dict)
    fit_corpus: str = "T"  # each task's own sentences (data/fit_corpora.py)
    analysis: bool = False
    task_registry: str | None = None
    family_args: dict | None = field(default_factory=dict)  # evaluation family -> its settings (evaluation/families.py)
    dims: Sequence[AtLeastOne] = ()  # Matryoshka widths: each pooler also scored on its first d components

    def __post_init__(self) -> None:
        from promptemb.evaluation.scoring_options import check_dims

        check_dims(self.dims, width=0)  # integers >= 1, none twice; the model's width is checked once it loads


class ModelSettings(CommandSettings):
    """What evaluate.py's two commands share: the model (`backbone`: `Encoder`'s keyword arguments, checked against
    its constructor), its template, and where data and run folder are."""

    data_root: str | None
    task_name: str
    output_dir: str
    paths: RunPaths
    backbone: dict
    template: TemplateSettings
    pooler_args: OpenMap
    fit_corpus: str
    task_registry: str | None
    max_sentence_tokens: AtLeastOne | None
    seed: Seed
    allow_unverified_weights: bool
    progress: bool
    resolved: dict  # every value, recorded with the results

    @property
    def model_name(self) -> str:
        return str(self.backbone["name_or_path"])

    @property
    def revision(self) -> str | None:
        """The Hub revision the backbone names, if any (a config read before the weights load uses it too)."""
        return self.backbone.get("revision")

    @property
    def opening(self) -> dict:
        """How a trained model is opened: the backbone's device and batch size."""
        return {"device": self.backbone["device"], "batch_size": self.backbone["batch_size"]}

    @property
    def inference(self):
        """The backbone's inference keys as the encoder takes them (`InferenceOptions`), for a pretrained and a
        trained model alike."""
        from promptemb.encoder.model import InferenceOptions

        return InferenceOptions(**{name: self.backbone[name] for name in inference_keys() if name in self.backbone})

    @model_validator(mode="before")
    @classmethod
    def record(cls, values: dict) -> dict:
        return {**values, "resolved": values} if isinstance(values, dict) else values

    @model_validator(mode="after")
    def check(self, info: ValidationInfo) -> ModelSettings:
        """After pydantic's types and keys: the backbone against `Encoder`, a single template; then everything that
        can be refuted before a model or a data file is loaded (one `ConfigError` line each): the device, the files
        read and written, the model's files, and the options a trained model would ignore (`info.context`: the
        command's `RunContext`, whose overrides say which keys were given)."""
        check_template(self.resolved, None)
        if not composition_only(info.context):
            self.check_data()
        self.check_names()
        check_backbone(self.resolved)
        if composition_only(info.context):
            return self
        backbone = self.backbone
        check_device("backbone.device", str(backbone.get("device", "auto")))
        if self.task_registry:
            check_readable_file("task_registry", self.task_registry)
        self.check_outputs()
        if isinstance(name := backbone.get("name_or_path"), str):
            from promptemb.encoder.loading import check_model_source

            check_model_source(name)
            if backbone.get("revision") and (name.startswith(("package:", "model:"))
                                             or Path(name).expanduser().exists()):
                raise ConfigError(f"backbone.revision={backbone['revision']} selects a version of a Hugging Face Hub "
                                  f"model, but {name} is local: drop backbone.revision")
            check_source_options(name, self.allow_unverified_weights, getattr(info.context, "overrides", ()))
        return self


class EvaluateSettings(ModelSettings):
    """evaluate.py's keys (configs/eval.yaml): score poolers on tasks."""

    described_as: ClassVar[str] = "evaluate.py's config"

    mode: Literal["score"]
    tasks: list[str]
    poolers: list[str]
    post: list[str]
    post_args: OpenMap
    analysis: bool
    family_args: OpenMap = Field(default_factory=dict)
    dims: list[AtLeastOne] = Field(default_factory=list)
    layers: list[NonNegativeInt] = Field(default_factory=list)

    @model_validator(mode="after")
    def check_layers(self) -> EvaluateSettings:
        """`layers` against `dims` (rows `pooler@l` and `pooler@d`); the model's depth is checked once it loads."""
        from promptemb.poolers.truncated import check_depths

        check_depths(self.layers, self.dims)
        return self

    @property
    def scoring(self) -> ScoringSettings:
        return ScoringSettings(**{name: getattr(self, name) for name in asdict(ScoringSettings())})

    def check_data(self) -> None:
        resolve_data_root(self.data_root)  # every task reads it

    def check_names(self) -> None:
        """The poolers and post-processors asked for are registered (the registries alone are imported)."""
        from promptemb.poolers.registry import check_pooler_names
        from promptemb.postprocessing.registry import check_post_names

        check_pooler_names(self.poolers, self.pooler_args)
        check_post_names(self.post, self.post_args)

    def check_outputs(self) -> None:
        check_writable_dir("output_dir", self.output_dir)


class EncodeSettings(ModelSettings):
    """promptemb-encode's keys (configs/encode.yaml, = evaluate.py mode=encode): embed a text file with one pooler."""

    described_as: ClassVar[str] = "promptemb-encode's config"

    mode: Literal["encode"]
    pooler: str
    input: str | None
    output: str | None

    def check_data(self) -> None:
        """An encode run reads the data root only where its pooler is fitted on a named corpus (checked then)."""

    def check_names(self) -> None:
        from promptemb.poolers.registry import check_pooler_names

        check_pooler_names([self.pooler], self.pooler_args)

    def check_outputs(self) -> None:
        if not (self.input and self.output):
            raise ConfigError("mode=encode needs input=FILE.txt and output=FILE.npy")
        check_readable_file("input", self.input)
        if (path := Path(self.output)).is_dir():
            raise ConfigError(f"output={str(path)!r} is a directory; pass a file name such as emb.npy")
        check_writable_dir("output", path.parent)


def inference_keys() -> list[str]:
    """The `backbone` keys that say how the encoder runs rather than what it is."""
    from promptemb.encoder.model import InferenceOptions

    return [field.name for field in fields(InferenceOptions)]


#: `backbone` keys a trained model takes from its own record: it is scored as it was trained or exported.
KEPT_BY_TRAINED_MODELS = ("max_length", "dtype", "revision", "padding_side", "device_map", "quantization")


def check_source_options(name_or_path: str, allow_unverified_weights: bool, overrides: tuple[str, ...]) -> None:
    """A `backbone.*` override on the command line that a trained model would ignore, or the export-only
    `allow_unverified_weights` on another kind of model: one line each."""
    kind = source_kind(name_or_path)
    for _, key, _ in map(split_override, overrides) if kind != "pretrained" else ():
        group, _, leaf = key.partition(".")
        if group == "backbone" and leaf in KEPT_BY_TRAINED_MODELS:
            raise ConfigError(f"{key}= does not apply to a trained model ({kind}): it is scored with the {leaf} it "
                              f"was trained or exported with; drop {key}=")
    if allow_unverified_weights and kind != "export":
        raise ConfigError(f"allow_unverified_weights=true applies to an export folder (weight files checked against "
                          f"their recorded sha256); {name_or_path} is a {kind} model: drop it")
