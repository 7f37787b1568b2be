"""What `evaluate.py` runs with its checked settings: `score` (STS table with provenance) and `encode` (embeddings
of a text file)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from promptemb.common.errors import ConfigError
from promptemb.common.io import atomic_write, atomic_write_json
from promptemb.common.run_context import FROM_PYTHON, RunContext
from promptemb.common.run_folder import remove_if_untouched
from promptemb.common.seed import seed_everything
from promptemb.data.fit_corpora import TARGET, Corpora
from promptemb.data.readers import read_sentences
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import REGISTRY_FILE, load_registry
from promptemb.encoder.model import (
    Encoder,
    check_poolers_on_config,
    combine_needs,
    expand_parts,
    reads_run_template,
)
from promptemb.encoder.settings import TemplateSettings
from promptemb.encoder.template import Template
from promptemb.evaluation.report import markdown_table, scoring_provenance, software_versions
from promptemb.evaluation.session import ScoringSession
from promptemb.evaluation.settings import EncodeSettings, EvaluateSettings
from promptemb.inference.model_sources import check_input_form, merge_poolers, open_trained_model
from promptemb.poolers import build_pooler
from promptemb.poolers.fitted import CorpusFittedPooler
from promptemb.poolers.truncated import at_depths

log = logging.getLogger(__name__)
#: What `run` takes: one settings object per command.
Settings = EvaluateSettings | EncodeSettings


def build_template(template: TemplateSettings) -> Template | None:
    """The template group's single template (configs/template/), or None to score sentences alone."""
    return Template(template.text) if template.text else None


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


def build_encoder(settings: Settings, poolers) -> Encoder:
    """`Encoder` from the backbone's keyword arguments (checked against its constructor) and what the poolers need."""
    needs = combine_needs(poolers)
    check_poolers_on_config(settings.model_name, poolers, settings.revision)
    return Encoder(**settings.backbone, attentions=needs.attentions, mlm_head=needs.mlm_head,
                   progress=settings.progress)


@dataclass
class Scoring:
    """The encoder, poolers and input form a run scores with; `source` describes a trained model's origin."""

    encoder: Encoder
    poolers: list
    template: Template | None
    sentence_rule: str
    max_sentence_tokens: int | None
    source: dict | None = None


def open_scoring(settings: Settings, poolers: list) -> Scoring:
    """A trained model (checkpoint, run folder, export) with its own poolers and recorded input form, then the
    configured `poolers` not already among them; a pretrained model with the configured template and poolers."""
    rule, name_or_path = settings.template.sentence_rule, settings.model_name
    trained = open_trained_model(name_or_path, **settings.opening, attentions=combine_needs(poolers).attentions,
                                 verify_weights=not settings.allow_unverified_weights)
    if trained is None:
        template = build_template(settings.template)
        check_template_is_read(template, rule, poolers)
        return Scoring(build_encoder(settings, poolers), poolers, template, rule, settings.max_sentence_tokens)
    check_input_form(trained, settings.template.text, rule, settings.max_sentence_tokens)
    trained.encoder.progress = settings.progress
    trained.encoder.use_inference_options(settings.inference)
    if trained.source.get("weights_verified") is False:
        log.warning("scoring an UNVERIFIED model (allow_unverified_weights=true): %s", trained.source["weights_note"])
    log.info("scoring %s %s with its own template %r and poolers %s", trained.source["kind"], name_or_path,
             trained.template and trained.template.text, ", ".join(p.name for p in trained.poolers))
    return Scoring(trained.encoder, merge_poolers(trained.poolers, poolers, settings.pooler_args), trained.template,
                   trained.sentence_rule, trained.max_sentence_tokens, trained.source)


class Evaluation:
    """What evaluate.py builds from its settings before any work: the scoring session and its tasks (score mode) or
    the pooler and the input sentences (encode mode), then the model to score (`Scoring`). A mistake in any of them
    fails here, before the first forward pass; `run` then scores or encodes."""

    def __init__(self, settings: Settings):
        self.settings = settings
        seed_everything(settings.seed)
        if settings.mode == "score":
            self.session = ScoringSession(settings.scoring, settings.data_root)
            # an unknown task, or family settings no task reads, fail before the model loads
            self.session.check_family_args(self.session.tasks(settings.tasks), settings.tasks)
            poolers = self.session.poolers
        else:
            poolers = [build_pooler(settings.pooler, member_args=settings.pooler_args,
                                    **settings.pooler_args.get(settings.pooler, {}))]
            self.pooler_name = poolers[0].name  # a trained model's own pooler of that name replaces it
            self.sentences = read_sentences(Path(settings.input))
        self.started, self.versions = time.perf_counter(), software_versions()
        self.scoring = open_scoring(settings, poolers)
        if settings.mode == "score" and settings.layers:  # the model's own poolers too, each at every depth
            self.scoring.poolers = at_depths(self.scoring.poolers, settings.layers, self.scoring.encoder.num_layers)

    def run(self) -> dict | np.ndarray:
        return self.score() if self.settings.mode == "score" else self.encode()

    def score(self) -> dict:
        """Score every configured pooler on every configured task (STS, transfer, clustering, mixed); write
        results.json, results.md and one PNG per task family."""
        settings, session, scoring = self.settings, self.session, self.scoring
        encoder = scoring.encoder
        options = session.options(scoring.template, scoring.sentence_rule, scoring.max_sentence_tokens)
        result = session.score(encoder, settings.tasks, scoring.poolers, options)
        prov = session.provenance(encoder, options, scoring.poolers, result, self.versions)
        if scoring.source is not None:
            prov["model"]["source"] = scoring.source
        prov.update(seed=settings.seed, config=settings.resolved)
        prov["layers"] = list(settings.layers)  # rows `pooler@l`: the model cut after layer l
        prov["data_root"] = str(session.corpora().root)
        prov["forward_sequences"] = encoder.stats.forward_sequences
        prov["forward_forms"] = encoder.stats.forms
        prov["wall_time_s"] = round(time.perf_counter() - self.started, 2)
        results = session.record(result, prov)
        json_path, md_path = session.report(Path(settings.output_dir), results)
        for family, family_result in results["families"].items():
            print(f"{family}:\n{markdown_table(family_result['scores'])}", end="")
        print(f"wall time {prov['wall_time_s']:.1f} s; wrote {json_path} and {md_path}")
        return results

    def encode(self) -> np.ndarray:
        """Embed each line of `input` with `pooler`; write float32 `output` (.npy) and `output`.json provenance."""
        settings, sentences = self.settings, self.sentences
        # a trained model's own pooler of that name (e.g. its denoised [MASK] with its head) replaces the built one
        pooler = next(p for p in self.scoring.poolers if p.name == self.pooler_name)
        scoring = replace(self.scoring, poolers=[pooler])
        encoder, template = scoring.encoder, scoring.template
        encoder.check_poolers([pooler], template)  # binds tokenizer and encoder, which some fits need
        if isinstance(pooler, CorpusFittedPooler):
            # "T" is the input file itself; any other label is resolved as for scoring
            label = pooler.corpus or settings.fit_corpus
            Corpora.check_label(label)
            fit_sentences = sentences if label == TARGET else Corpora(
                resolve_data_root(settings.data_root), load_registry(Path(settings.task_registry or REGISTRY_FILE))
            ).sentences(label)
            pooler.fit(label, fit_sentences, encoder.tokenizer)
        embeddings = encoder.embed(sentences, [pooler], template, scoring.sentence_rule,
                                   scoring.max_sentence_tokens)[pooler.name]
        embeddings = embeddings.astype(np.float32)
        (label, cut), = encoder.truncation.items()
        truncated = int(cut.truncated.sum())
        if truncated:
            log.warning("%s: %s of %s sentences longer than %d tokens were truncated (%s input)", settings.input,
                        f"{truncated:,}", f"{len(sentences):,}", cut.max_sentence_tokens, label)
        output = Path(settings.output)

        def save(tmp: Path) -> None:
            with tmp.open("wb") as handle:
                np.save(handle, embeddings)

        atomic_write(output, save)
        prov = scoring_provenance(encoder, template, scoring.sentence_rule, scoring.max_sentence_tokens, [pooler])
        if scoring.source is not None:
            prov["model"]["source"] = scoring.source
        atomic_write_json(output.with_suffix(output.suffix + ".json"),
                          {"input": settings.input, "rows": len(sentences),
                           "truncated": {"sentences": truncated, "max_tokens": cut.max_sentence_tokens},
                           "provenance": {**prov, "seed": settings.seed, "config": settings.resolved}})
        print(f"wrote {output}: {embeddings.shape[0]} x {embeddings.shape[1]} float32 ({pooler.name} pooling)")
        return embeddings


def run(settings: Settings, context: RunContext = FROM_PYTHON) -> dict | np.ndarray:
    """Score or encode. Hydra's run folder is `output_dir`: encode mode, whose output is a file of its own, leaves
    none behind."""
    result = Evaluation(settings).run()
    if settings.mode == "encode":
        remove_if_untouched(context.run_dir)
    return result
