"""Export round trip on a real checkpoint: framework embeddings vs the exported directory loaded three ways, on the
STS-B test sentences, with the STS-B test Spearman of each.

    python scripts/export_roundtrip.py --ckpt logs/quickstart --out /tmp/minilm-export [--results DIR [--overwrite]]

`--ckpt` is a checkpoint or a run folder (its best checkpoint). `roundtrip.json` / `.md` go to a fresh folder
(default `logs/export_roundtrip/<time>`; a non-empty `--results` is refused unless `--overwrite`).

Paths compared (all with the exported pooler, the checkpoint's primary evaluation pooler):
  framework      the module rebuilt from the checkpoint, scored by evaluate_sts (what train.py's callback reports)
  st             SentenceTransformer(DIR, trust_remote_code=True).encode  (standalone module, no promptemb code)
  api_export     inference.load_encoder(DIR).encode                       (HF directory + promptemb API)
  api_ckpt       inference.load_encoder(CKPT).encode
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from promptemb.common.errors import exit_on_user_error
from promptemb.common.io import atomic_write_json, atomic_write_text
from promptemb.common.output_dirs import fresh_output_dir
from promptemb.data.root import resolve_data_root
from promptemb.data.tasks import get_tasks
from promptemb.encoder.sources import source_kind
from promptemb.evaluation.report import software_versions
from promptemb.evaluation.scoring_options import ScoringOptions
from promptemb.evaluation.sts import SentenceIndex, cosine_rows, evaluate_sts, load_and_index, spearman_x100
from promptemb.exporting.runner import export_checkpoint
from promptemb.inference import load_encoder
from promptemb.inference.model_sources import best_checkpoint
from promptemb.lightning_modules.checkpoint import load_module_checkpoint


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="a train.py checkpoint or run folder (its best checkpoint)")
    parser.add_argument("--out", required=True, help="export directory (must not exist)")
    parser.add_argument("--results", default=None, help="default: a new folder logs/export_roundtrip/<time>")
    parser.add_argument("--overwrite", action="store_true", help="replace the files of a non-empty --results")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    results_dir = fresh_output_dir(args.results, "export_roundtrip", args.overwrite)
    if source_kind(args.ckpt) == "run":
        args.ckpt = str(best_checkpoint(Path(args.ckpt)))
    root = resolve_data_root(args.data_root)
    task = get_tasks(["STSBenchmark"])[0]
    index = SentenceIndex()
    (indexed,) = load_and_index([task], root, index)
    gold = indexed.pairs.gold_array()
    timings, embeddings, scores = {}, {}, {}

    started = time.perf_counter()
    loaded = load_module_checkpoint(args.ckpt)
    module = loaded.module
    encoder, pooler = module.evaluation_encoder(args.batch_size), module.eval_poolers()[0]
    embeddings["framework"] = encoder.embed(index.sentences, [pooler], module.eval_template,
                                            module.hparams.sentence_rule)[pooler.name]
    timings["framework"] = time.perf_counter() - started
    official = evaluate_sts(encoder, [task], root, [pooler],
                            ScoringOptions(module.eval_template, module.hparams.sentence_rule))
    scores["framework (evaluate_sts)"] = official["scores"][pooler.name]["STSBenchmark"]

    started = time.perf_counter()
    out = export_checkpoint(args.ckpt, args.out, score=True, data_root=str(root))
    timings["export (incl. scoring STS-B test)"] = time.perf_counter() - started

    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    st = SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    embeddings["st"] = st.encode(index.sentences, batch_size=args.batch_size, convert_to_numpy=True)
    timings["st"] = time.perf_counter() - started
    started = time.perf_counter()
    embeddings["api_export"] = load_encoder(out, batch_size=args.batch_size).encode(index.sentences)
    timings["api_export"] = time.perf_counter() - started
    started = time.perf_counter()
    embeddings["api_ckpt"] = load_encoder(args.ckpt, batch_size=args.batch_size).encode(index.sentences)
    timings["api_ckpt"] = time.perf_counter() - started

    reference = embeddings["framework"]
    rows = []
    for name, values in embeddings.items():
        score = spearman_x100(cosine_rows(values[indexed.left], values[indexed.right]), gold)
        scores[name] = score
        rows.append({"path": name, "max_abs_diff_vs_framework": float(np.abs(values - reference).max()),
                     "stsb_test_spearman_x100": score, "seconds": round(timings[name], 1)})
    record = json.loads((out / "config.json").read_text())["promptemb"]
    result = {
        "checkpoint": str(Path(args.ckpt).resolve()), "checkpoint_sha256": loaded.sha256, "export_dir": str(out),
        "task": "STSBenchmark test", "pairs": len(gold), "unique_sentences": len(index.sentences),
        "dimension": int(reference.shape[1]), "record": record, "rows": rows,
        "framework_evaluate_sts_spearman_x100": scores["framework (evaluate_sts)"],
        "export_seconds": round(timings["export (incl. scoring STS-B test)"], 1), "versions": software_versions(),
    }
    atomic_write_json(results_dir / "roundtrip.json", result)
    lines = [f"# Export round trip: `{Path(args.ckpt).name}`", "",
             f"STS-B test ({len(gold)} pairs, {len(index.sentences)} unique sentences); template "
             f"`{record['template']}`, pooler `{record['pooler']['name']}` (denoise {record['pooler']['denoise']}); "
             f"framework `evaluate_sts`: {scores['framework (evaluate_sts)']:.2f}", "",
             "| path | max abs diff vs framework | STS-B test Spearman x100 | seconds |", "|---|---:|---:|---:|"]
    lines += [f"| {r['path']} | {r['max_abs_diff_vs_framework']:.2e} | {r['stsb_test_spearman_x100']:.4f} | "
              f"{r['seconds']} |" for r in rows]
    text = "\n".join(lines) + "\n"
    atomic_write_text(results_dir / "roundtrip.md", text)
    print(text)


if __name__ == "__main__":
    main()
