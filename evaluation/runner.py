"""What `evaluate.py` runs: `score` (STS table with provenance) and `encode` (embeddings of a text file)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from promptemb.common.cli import split_override
from promptemb.common.errors import ConfigError
from promptemb.common.io import atomic_write, atomic_write_json
from promptemb.common.run_folder import discard_hydra_run_dir, nothing_left_on_user_error
from promptemb.common.seed import seed_everything
from promptemb.data.fit_corpora import TARGET, Corpora
from promptemb.data.readers import read_sentences
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import REGISTRY_FILE, load_registry
from promptemb.encoder.model import Encoder, combine_needs, expand_parts, reads_run_template
from promptemb.encoder.template import SENTENCE_RULES, Template
from promptemb.evaluation.config_checks import check_evaluate_config
from promptemb.evaluation.report import (
    markdown_table,
    scoring_provenance,
    software_versions,
)
from promptemb.evaluation.session import ScoringSession, ScoringSettings
from promptemb.inference.model_sources import check_input_form, merge_poolers, open_trained_model, source_kind
from promptemb.poolers import build_pooler
from promptemb.poolers.fitted import CorpusFittedPooler

log = logging.getLogger(__name__)
MODES = ("score", "encode")


def build_template(cfg: DictConfig) -> Template | None:
    """The template group's single template (configs/template/), or None to score sentences alone."""
    rule = cfg.template.sentence_rule
    if rule not in SENTENCE_RULES:
        raise ConfigError(f"unknown template.sentence_rule {rule!r}; valid: {', '.join(SENTENCE_RULES)}")
    return Template(str(cfg.template.text)) if cfg.template.text else None


def check_template_is_read(template: Template | None, sentence_rule: str, poolers) -> None:
    """A template (or a sentence rule) that no pooler reads would be recorded with every score and change none."""
    if template is None and sentence_rule != "none":
        raise ConfigError(f"template.sentence_rule={sentence_rule} applies to a templated input and no template is "
                          "set: set template=NAME or template.text=..., or drop the rule")
    if template is not None and not any(reads_run_template(p) for p in expand_parts(poolers)):
        names = ",".join(pooler.name for pooler in poolers)
        raise ConfigError(f"template.text is read by none of poolers=[{names}] (they run on the plain sentence or "
                          "their own template): add a pooler that reads it, such as mask or avg, or drop the "
                          "template")


def build_encoder(cfg: DictConfig, poolers) -> Encoder:
    needs = combine_needs(poolers)
    model = cfg.backbone
    return Encoder(
        str(model.name_or_path),
        device=model.device,
        batch_size=int(model.batch_size),
        max_length=model.max_length,
        dtype=model.dtype,
        revision=model.revision,
        attentions=needs.attentions,
        mlm_head=needs.mlm_head,
        progress=bool(cfg.progress),
        # decoders: big-model placement and loading, padding side (configs/backbone/decoder.yaml)
        device_map=model.get("device_map"),
        quantization=model.get("quantization"),
        padding_side=model.get("padding_side", "right"),
        **inference_options(model),
    )


def inference_options(backbone: DictConfig) -> dict:
    """How the encoder runs (`Encoder.use_inference_options`): the same for a pretrained and a trained model."""
    return {"autocast": str(backbone.get("autocast", "none")), "compile": bool(backbone.get("compile", False)),
            "parallel_batches": int(backbone.get("parallel_batches", 1)),
            "onednn_linears": bool(backbone.get("onednn_linears", False))}


#: `backbone` keys a trained model takes from its own record: it is scored as it was trained or exported.
KEPT_BY_TRAINED_MODELS = ("max_length", "dtype", "revision", "padding_side", "device_map", "quantization")


def check_backbone_overrides(kind: str) -> None:
    """One line for a `backbone.*` override on the command line that a trained model would ignore."""
    if not HydraConfig.initialized():  # called from Python: no command line to hold to account
        return
    for override in HydraConfig.get().overrides.task:
        _, key, _ = split_override(override)
        group, _, leaf = key.partition(".")
        if group == "backbone" and leaf in KEPT_BY_TRAINED_MODELS:
            raise ConfigError(f"{key}= does not apply to a trained model ({kind}): it is scored with the {leaf} it "
                              f"was trained or exported with; drop {key}=")


@dataclass
class Scoring:
    """The encoder, poolers and input form a run scores with; `source` describes a trained model's origin."""

    encoder: Encoder
    poolers: list
    template: Template | None
    sentence_rule: str
    max_sentence_tokens: int | None
    source: dict | None = None


def open_scoring(cfg: DictConfig, poolers: list) -> Scoring:
    """A trained model (checkpoint, run folder, export) with its own poolers and recorded input form, then the
    configured `poolers` not already among them; a pretrained model with the configured template and poolers."""
    name_or_path = str(cfg.backbone.name_or_path)
    if (kind := source_kind(name_or_path)) != "pretrained":
        check_backbone_overrides(kind)
    if cfg.get("allow_unverified_weights") and kind != "export":
        raise ConfigError(f"allow_unverified_weights=true applies to an export folder (weight files checked against "
                          f"their recorded sha256); {name_or_path} is a {kind} model: drop it")
    trained = open_trained_model(name_or_path, device=cfg.backbone.device, batch_size=int(cfg.backbone.batch_size),
                                 attentions=combine_needs(poolers).attentions,
                                 verify_weights=not cfg.get("allow_unverified_weights", False))
    if trained is None:
        template = build_template(cfg)
        check_template_is_read(template, str(cfg.template.sentence_rule), poolers)
        return Scoring(build_encoder(cfg, poolers), poolers, template, str(cfg.template.sentence_rule),
                       cfg.max_sentence_tokens)
    build_template(cfg)  # the sentence rule is checked as for any model
    check_input_form(trained, cfg.template.text, str(cfg.template.sentence_rule), cfg.max_sentence_tokens)
    trained.encoder.progress = bool(cfg.progress)
    trained.encoder.use_inference_options(**inference_options(cfg.backbone))
    if trained.source.get("weights_verified") is False:
        log.warning("scoring an UNVERIFIED model (allow_unverified_weights=true): %s", trained.source["weights_note"])
    log.info("scoring %s %s with its own template %r and poolers %s", trained.source["kind"], name_or_path,
             trained.template.text, ", ".join(p.name for p in trained.poolers))
    pooler_args = dict(cfg.get("pooler_args") or {})
    return Scoring(trained.encoder, merge_poolers(trained.poolers, poolers, pooler_args), trained.template,
                   trained.sentence_rule, trained.max_sentence_tokens, trained.source)


def provenance(cfg: DictConfig, scoring: Scoring, seed: int, versions: dict | None = None) -> dict:
    """`versions` as taken when the run started."""
    prov = scoring_provenance(scoring.encoder, scoring.template, scoring.sentence_rule, scoring.max_sentence_tokens,
                              scoring.poolers, versions)
    if scoring.source is not None:
        prov["model"]["source"] = scoring.source
    return {**prov, "seed": seed, "config": OmegaConf.to_container(cfg, resolve=True)}


def scoring_settings(cfg: DictConfig) -> ScoringSettings:
    """evaluate.py's `scoring` keys (configs/scoring/, at the top level of eval.yaml)."""
    names = ScoringSettings.__dataclass_fields__
    return ScoringSettings(**{name: OmegaConf.to_container(cfg[name]) if OmegaConf.is_config(cfg[name]) else cfg[name]
                              for name in names})


def score(cfg: DictConfig) -> dict:
    """Score every configured pooler on every configured task (STS, transfer, clustering, mixed); write
    results.json, results.md and one PNG per task family."""
    seed_everything(int(cfg.seed))
    session = ScoringSession(scoring_settings(cfg), cfg.data_root)
    session.tasks(list(cfg.tasks))  # an unknown task fails before the model loads
    started, versions = time.perf_counter(), software_versions()
    scoring = open_scoring(cfg, session.poolers)
    encoder = scoring.encoder
    options = session.options(scoring.template, scoring.sentence_rule, scoring.max_sentence_tokens)
    result = session.score(encoder, list(cfg.tasks), scoring.poolers, options)
    prov = session.provenance(encoder, options, scoring.poolers, result, versions)
    if scoring.source is not None:
        prov["model"]["source"] = scoring.source
    prov.update(seed=int(cfg.seed), config=OmegaConf.to_container(cfg, resolve=True))
    prov["data_root"] = str(session.corpora().root)
    prov["forward_sequences"] = encoder.stats.forward_sequences
    prov["wall_time_s"] = round(time.perf_counter() - started, 2)
    results = session.record(result, prov)
    json_path, md_path = session.report(Path(cfg.output_dir), results)
    for family, family_result in results["families"].items():
        print(f"{family}:\n{markdown_table(family_result['scores'])}", end="")
    print(f"wall time {prov['wall_time_s']:.1f} s; wrote {json_path} and {md_path}")
    return results


def encode(cfg: DictConfig) -> np.ndarray:
    """Embed each line of `input` with `pooler`; write float32 `output` (.npy) and `output`.json provenance."""
    if not cfg.input or not cfg.output:
        raise ConfigError("mode=encode needs input=FILE.txt and output=FILE.npy")
    seed_everything(int(cfg.seed))
    pooler_args = OmegaConf.to_container(cfg.pooler_args)
    pooler = build_pooler(str(cfg.pooler), member_args=pooler_args, **pooler_args.get(str(cfg.pooler), {}))
    sentences = read_sentences(Path(cfg.input))
    scoring = open_scoring(cfg, [pooler])
    # a trained model's own pooler of that name (e.g. its denoised [MASK] with its head) replaces the built one
    pooler = next(p for p in scoring.poolers if p.name == pooler.name)
    scoring = replace(scoring, poolers=[pooler])
    encoder, template = scoring.encoder, scoring.template
    encoder.check_poolers([pooler], template)  # binds tokenizer and encoder, which some fits need
    if isinstance(pooler, CorpusFittedPooler):
        # "T" is the input file itself; any other label is resolved as for scoring
        label = pooler.corpus or str(cfg.fit_corpus)
        Corpora.check_label(label)
        fit_sentences = sentences if label == TARGET else Corpora(
            resolve_data_root(cfg.data_root), load_registry(Path(cfg.task_registry or REGISTRY_FILE))
        ).sentences(label)
        pooler.fit(label, fit_sentences, encoder.tokenizer)
    embeddings = encoder.embed(sentences, [pooler], template, scoring.sentence_rule,
                               scoring.max_sentence_tokens)[pooler.name]
    embeddings = embeddings.astype(np.float32)
    (label, cut), = encoder.truncation.items()
    truncated = int(cut.truncated.sum())
    if truncated:
        log.warning("%s: %s of %s sentences longer than %d tokens were truncated (%s input)", cfg.input,
                    f"{truncated:,}", f"{len(sentences):,}", cut.max_sentence_tokens, label)
    output = Path(cfg.output)

    def save(tmp: Path) -> None:
        with tmp.open("wb") as handle:
            np.save(handle, embeddings)

    atomic_write(output, save)
    atomic_write_json(output.with_suffix(output.suffix + ".json"),
                      {"input": str(cfg.input), "rows": len(sentences),
                       "truncated": {"sentences": truncated, "max_tokens": cut.max_sentence_tokens},
                       "provenance": provenance(cfg, scoring, int(cfg.seed))})
    print(f"wrote {output}: {embeddings.shape[0]} x {embeddings.shape[1]} float32 ({pooler.name} pooling)")
    return embeddings


def run(cfg: DictConfig):
    """Hydra's run folder is `output_dir`: a failed run leaves none behind (nor does encode mode, whose output is a
    file of its own)."""
    with nothing_left_on_user_error():
        if cfg.mode not in MODES:
            raise ConfigError(f"unknown mode {cfg.mode!r}; valid: {', '.join(MODES)}")
        check_evaluate_config(cfg)
        if cfg.mode == "score":
            return score(cfg)
        embeddings = encode(cfg)
    discard_hydra_run_dir()
    return embeddings
