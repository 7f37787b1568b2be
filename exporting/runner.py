"""What export.py runs: checkpoint (or a plain model with a template) -> one directory that is a Hugging Face model
dir and a sentence-transformers model, written to a temporary directory beside `out` and renamed into place at the
end (never half-written). Encoders pool [MASK] or avg, decoders (causal LMs) their template's last token; a LoRA
checkpoint is merged into full weights (`adapter=merge`) or kept as a peft adapter on its base (`adapter=keep`). The
sentence-transformers files are native modules where they can express the pooling, else the custom module
(`format=`, exporting/st_layout.py)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from promptemb.common.errors import ConfigError, DataError
from promptemb.common.io import umask_mode
from promptemb.common.optional import require
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.sources import export_block, source_kind
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import evaluate_sts
from promptemb.exporting.hf_export import write_hf_directory
from promptemb.exporting.model_card import model_card
from promptemb.exporting.st_export import write_sentence_transformers_files
from promptemb.exporting.st_layout import ExportFormat, STLayout, choose_layout
from promptemb.inference.model_sources import best_checkpoint
from promptemb.inference.prompt_encoder import PromptEncoder
from promptemb.lightning_modules.checkpoint import read_checkpoint
from promptemb.lightning_modules.recipe import recipe_of_checkpoint


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an `output_dir` that cannot take the export (and an install without the export
    extra)."""
    require("sentence_transformers", "export")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir={out} is a file; pass a directory path")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"output_dir={out} exists and is not empty; pass overwrite=true to replace it, or "
                              "another output_dir=DIR")
        if not is_export(out):
            raise ConfigError(f"output_dir={out} is not a promptemb export (no config.json with a promptemb block); "
                              "overwrite=true only replaces an earlier export: pass another output_dir=DIR")


def is_export(directory: Path) -> bool:
    try:
        return export_block(directory) is not None
    except DataError:  # a config.json that is not JSON: not ours to delete
        return False


def run_scores(checkpoint: Path, encoder: PromptEncoder) -> tuple[dict | None, str | None]:
    """The STS table of the run that wrote `checkpoint` (`<run>/results.json`, two levels up), if it scored this
    very checkpoint with the pooler being exported (a `pooler=` / `denoise=` override the run did not score leaves
    the card without the run's table)."""
    results = checkpoint.resolve().parent.parent / "results.json"
    if not results.is_file():
        return None, None
    # a decoder checkpoint's last-token pooler is logged under the recipes' selection name, `mask`
    name = "mask" if encoder.is_decoder else encoder.pooler_name
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
        scored = Path(data["provenance"]["model"]["checkpoint"])
        scored_pooler = data["provenance"]["poolers"][name]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None, None
    same_pooler = bool(scored_pooler.get("denoise", False)) == encoder.denoise
    if scored.name != checkpoint.name or not same_pooler:
        return None, None
    return data["scores"], f"the training run's final scoring of this checkpoint ({results})"


def score_encoder(encoder: PromptEncoder, tasks: list[str], data_root: str | None) -> dict:
    options = ScoringOptions(encoder.template, encoder.sentence_rule, encoder.max_sentence_tokens)
    result = evaluate_sts(encoder.encoder, get_tasks(tasks), resolve_data_root(data_root), [encoder.pooler], options)
    return result["scores"]


def export_checkpoint(
    ckpt_path: str | Path | None,
    output_dir: str | Path | None,
    *,
    pooler: str | None = None,
    denoise: bool | None = None,
    overwrite: bool = False,
    score: bool = False,
    score_tasks: tuple[str, ...] | list[str] = ("STSBenchmark",),
    data_root: str | None = None,
    base_model: str | None = None,
    adapter: str | None = None,
    format: ExportFormat = "auto",
) -> Path:
    """Export `ckpt_path` (a checkpoint or a run folder: its best checkpoint) to `output_dir`; returns it. Nothing
    is written unless the whole export succeeds. `adapter` (the LoRA recipes' checkpoints): "merge" (None: the same,
    full weights any tool loads) or "keep". `format`: the sentence-transformers layout (exporting/st_layout.py)."""
    if not ckpt_path or not output_dir:
        raise ConfigError("export needs ckpt_path=PATH (a train.py checkpoint or run folder) and output_dir=DIR (the "
                          "export directory)")
    ckpt, out = Path(ckpt_path), Path(output_dir)
    if source_kind(str(ckpt)) == "run":  # a train.py run folder: its best checkpoint
        ckpt = best_checkpoint(ckpt)
    check_out(out, overwrite)
    if recipe_of_checkpoint(read_checkpoint(ckpt), ckpt).adapter_only and adapter is None:  # the header only
        adapter = "merge"
    encoder = PromptEncoder.from_checkpoint(ckpt, base_model=base_model, pooler=pooler, denoise=denoise,
                                            adapter=adapter)
    scores, score_source = run_scores(ckpt, encoder)
    return write_export(encoder, out, scores, score_source, score=score, score_tasks=score_tasks,
                        data_root=data_root, format=format)


def export_module(module, output_dir: str | Path, *, pooler: str | None = None, denoise: bool | None = None,
                  adapter: str | None = None, overwrite: bool = False, format: ExportFormat = "auto") -> Path:
    """Export a trained module from Python (what `export_checkpoint` does with the module it rebuilds): as its
    recipe says it encodes; a LoRA recipe's adapter merged into full weights unless `adapter="keep"`."""
    out = Path(output_dir)
    check_out(out, overwrite)
    if type(module).adapter_only and adapter is None:
        adapter = "merge"
    encoder = PromptEncoder.from_module(module, pooler=pooler, denoise=denoise, adapter=adapter)
    return write_export(encoder, out, None, None, score=False, score_tasks=(), data_root=None, format=format)


def export_model(
    model: str | None,
    output_dir: str | Path | None,
    *,
    template: str | None = None,
    sentence_rule: str = "none",
    pooler: str | None = None,
    layer: int = -1,
    max_length: int | None = None,
    max_sentence_tokens: int | None = None,
    padding_side: str | None = None,
    overwrite: bool = False,
    score: bool = False,
    score_tasks: tuple[str, ...] | list[str] = ("STSBenchmark",),
    data_root: str | None = None,
    format: ExportFormat = "auto",
) -> Path:
    """Export a plain model (hub name, local directory or `package:MODULE`, encoder or decoder) with a template (None:
    the plain sentence); a decoder pools the last token, an encoder the template's [MASK] or the mean (avg)."""
    if not model or not output_dir:
        raise ConfigError("export needs pretrained=NAME_OR_PATH (a plain encoder or decoder) and output_dir=DIR (the "
                          "export directory)")
    out = Path(output_dir)
    check_out(out, overwrite)
    encoder = PromptEncoder.from_pretrained(model, template=template, sentence_rule=sentence_rule, pooler=pooler,
                                            layer=layer, max_length=max_length,
                                            max_sentence_tokens=max_sentence_tokens,
                                            padding_side=padding_side or "left")
    return write_export(encoder, out, None, None, score=score, score_tasks=score_tasks, data_root=data_root,
                        format=format)


def write_export(encoder: PromptEncoder, out: Path, scores: dict | None, score_source: str | None, *, score: bool,
                 score_tasks, data_root: str | None, format: ExportFormat = "auto") -> Path:
    """Choose the sentence-transformers layout (a `format=native` the pooling cannot have is refused here, before
    any scoring or writing), score (when asked), then write the export to a temporary directory beside `out` and
    rename it into place."""
    layout = choose_layout(encoder, format)
    if score:
        scores = score_encoder(encoder, list(score_tasks), data_root)
        score_source = f"export.py score=true with the exported pooler on {', '.join(score_tasks)}"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        record = write_model_files(encoder, tmp, layout)
        (tmp / "README.md").write_text(model_card(record, scores, score_source), encoding="utf-8")
        default_permissions(tmp)
        replace_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def write_model_files(encoder: PromptEncoder, directory: Path, layout: STLayout) -> dict:
    """The sentence-transformers files, then the Hugging Face directory, whose record (returned) says which layout
    it is and hashes every weight file, the native modules' included."""
    write_sentence_transformers_files(directory, layout.native, encoder.encoder.hidden_size)
    return write_hf_directory(encoder, directory, layout.record())


def default_permissions(directory: Path) -> None:
    """mkdtemp (and some writers) create owner-only entries; give the export the umask's usual modes."""
    directory.chmod(umask_mode(directory=True))
    for path in directory.iterdir():
        path.chmod(umask_mode(directory=path.is_dir()))


def replace_directory(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; an existing `out` (overwrite=true, or empty) is moved aside first, then removed."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
