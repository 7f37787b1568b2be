"""docs/reference.md, generated from the registries: every registered pooler and post-processor with its class, its
default arguments, the formula its class docstring states and the paper it follows; every built-in recipe with its
class, its model config, the experiments that train it and the method and paper its module states.

    python -m promptemb.research.component_reference            # rewrite docs/reference.md
    python -m promptemb.research.component_reference --check    # exit 1 when docs/reference.md is out of date
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

import yaml

from promptemb.common.io import atomic_write_text
from promptemb.configs import CONFIG_DIR
from promptemb.lightning_modules.recipe import RECIPES, register_builtin_recipes
from promptemb.poolers.registry import BUILTIN_POOLERS as POOLERS
from promptemb.poolers.registry import PAPERS as POOLER_PAPERS
from promptemb.postprocessing.registry import PAPERS as POST_PAPERS
from promptemb.postprocessing.registry import POSTS

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def formula(obj) -> str:
    """The first paragraph of a docstring: the formula each pooler and post-processor states first, the method and
    paper a recipe's module states first."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def experiment_models() -> dict[str, str]:
    """experiment -> the model config it trains: its `override /model`, else its parent experiment's, else
    train.yaml's default."""
    defaults = {path.stem: read_yaml(path).get("defaults") or [] for path in sorted((CONFIG_DIR / "experiment").glob(
        "*.yaml"))}
    default_model = next(entry["model"] for entry in read_yaml(CONFIG_DIR / "train.yaml")["defaults"]
                         if isinstance(entry, dict) and "model" in entry)

    def model_of(name: str) -> str:
        for entry in defaults[name]:
            if isinstance(entry, dict) and "override /model" in entry:
                return entry["override /model"]
            if isinstance(entry, str) and entry in defaults:
                return model_of(entry)
        return default_model
    return {name: model_of(name) for name in defaults}


def recipes_table() -> list[str]:
    register_builtin_recipes()
    configs = {read_yaml(path)["model"]["_target_"]: path.stem
               for path in sorted((CONFIG_DIR / "model").glob("*.yaml"))}
    trained = experiment_models()
    rows = ["| name | class | model config | experiments | method |", "|---|---|---|---|---|"]
    for name, cls in sorted(RECIPES.items()):  # by name: registration order is import order, which varies
        if not cls.__module__.startswith("promptemb."):  # a user's recipe registered in this process
            continue
        path = f"{cls.__module__}.{cls.__name__}"
        config = configs.get(path)
        experiments = ", ".join(f"`{e}`" for e, model in trained.items() if model == config) or "-"
        method = formula(inspect.getmodule(cls)).replace("|", "\\|")
        rows.append(f"| `{name}` | `{path.removeprefix('promptemb.')}` | `model={config}` | {experiments} | {method} |")
    return rows


def missing_entries() -> list[str]:
    """Registered names without a paper or without a formula in their class docstring."""
    missing = [f"pooler {name}: no paper" for name in POOLERS if not POOLER_PAPERS.get(name)]
    missing += [f"post-processor {name}: no paper" for name in POSTS if not POST_PAPERS.get(name)]
    for kind, registry in (("pooler", POOLERS), ("post-processor", POSTS)):
        missing += [f"{kind} {name}: no formula" for name, (cls, _) in registry.items() if "=" not in formula(cls)]
    return missing


def table(registry: dict, papers: dict[str, str]) -> list[str]:
    rows = ["| name | class | defaults | formula | paper |", "|---|---|---|---|---|"]
    for name, (cls, defaults) in registry.items():
        shown = ", ".join(f"{key}={value!r}" for key, value in defaults.items()) or "-"
        cell = formula(cls).replace("|", "\\|")
        rows.append(f"| `{name}` | `{cls.__module__.removeprefix('promptemb.')}.{cls.__name__}` | {shown} | {cell} | "
                    f"{papers[name]} |")
    return rows


def render() -> str:
    lines = ["# Pooler, post-processor and recipe reference", "",
             "Generated from the registries (`poolers/registry.py`, `postprocessing/registry.py`, the recipes')",
             "and docstrings by `python -m promptemb.research.component_reference`; do not edit by hand. Each",
             "pooler or post-processor is usable in `poolers=[...]` / `post=[...]`; `pooler_args.NAME.KEY=...`",
             "overrides a default. How the poolers score on real models: docs/poolers.md and docs/results.md.",
             "`NAME@LAYER` builds a pooler that reads one layer at that hidden-state index (`mask@3`); evaluate.py's",
             "`layers=[...]` scores every pooler on the model cut after each layer (`poolers/truncated.py`),",
             "`dims=[...]` at each width.", "",
             "## Poolers", "",
             *table(POOLERS, POOLER_PAPERS), "", "## Post-processors", "",
             "Each is fitted on a named corpus (`fit_corpus`: T, W, stsb_train, file:PATH) and its label travels with",
             "every score it produced.", "", *table(POSTS, POST_PAPERS), "", "## Recipes", "",
             "The built-in training recipes (`@register_recipe`, lightning_modules/recipe.py), each trained with",
             "`python train.py experiment=NAME` or `model=CONFIG`; their settings, formulas and kept differences from",
             "the official code: docs/training.md; a recipe of your own: docs/extending.md.", "", *recipes_table(), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m promptemb.research.component_reference",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs from the registries")
    args = parser.parse_args(argv)
    if missing := missing_entries():
        print(f"error: registered names without a reference entry: {'; '.join(missing)}", file=sys.stderr)
        return 1
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else ""
        if current != text:
            print(f"error: {args.output} is out of date; run python -m promptemb.research.component_reference",
                  file=sys.stderr)
            return 1
        return 0
    atomic_write_text(args.output, text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
