"""docs/reference.md, generated from the pooler and post-processor registries: every registered name with its class,
its default arguments, the formula its class docstring states and the paper it follows.

    python -m promptemb.research.component_reference            # rewrite docs/reference.md
    python -m promptemb.research.component_reference --check    # exit 1 when docs/reference.md is out of date
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

from promptemb.common.io import atomic_write_text
from promptemb.poolers.registry import BUILTIN_POOLERS as POOLERS
from promptemb.poolers.registry import PAPERS as POOLER_PAPERS
from promptemb.postprocessing.registry import PAPERS as POST_PAPERS
from promptemb.postprocessing.registry import POSTS

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def formula(cls: type) -> str:
    """The first paragraph of the class docstring: the formula each pooler and post-processor states first."""
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


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
    lines = ["# Pooler and post-processor reference", "",
             "Generated from the registries (`poolers/registry.py`, `postprocessing/registry.py`) and the",
             "classes' docstrings by `python -m promptemb.research.component_reference`; do not edit by hand. Each",
             "name is usable in `poolers=[...]` / `post=[...]`; `pooler_args.NAME.KEY=...` overrides a default. How",
             "the poolers score on real models: docs/poolers.md and docs/results.md. `NAME@LAYER` builds a pooler",
             "that reads one layer at that hidden-state index (`mask@3`); evaluate.py's `layers=[...]` scores every",
             "pooler on the model cut after each layer (`poolers/truncated.py`), `dims=[...]` at each width.", "",
             "## Poolers", "",
             *table(POOLERS, POOLER_PAPERS), "", "## Post-processors", "",
             "Each is fitted on a named corpus (`fit_corpus`: T, W, stsb_train, file:PATH) and its label travels with",
             "every score it produced.", "", *table(POSTS, POST_PAPERS), ""]
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
