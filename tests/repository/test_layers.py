"""The package's layers only point down, and no module imports itself in a circle.

Layers, bottom to top: configs, common -> encoder (owning EncoderOutput and the pooler contract) -> poolers,
postprocessing, data -> lightning_modules (the recipes), evaluation -> inference, callbacks -> training, exporting,
research. An import from a folder to a folder of a higher layer is an upward import. Read from the source with
`ast` (every import, also those inside functions), so the test needs nothing installed beyond the standard library.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = [("configs", "common"), ("encoder",), ("poolers", "postprocessing", "data"),
          ("lightning_modules", "evaluation"), ("inference", "callbacks"), ("training", "exporting", "research")]
LAYER_OF = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}


def package_modules() -> dict[str, Path]:
    return {f"promptemb.{path.parent.name}.{path.stem}".removesuffix(".__init__"): path
            for folder in LAYER_OF for path in (REPO / folder).glob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `path` imports (an `import a.b` / `from a.b import c`, where c may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("promptemb."):
            found |= {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
            if node.module in modules:
                found.add(node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def folder(module: str) -> str:
    return module.split(".")[1]


def test_no_import_runs_from_a_lower_layer_up():
    upward = sorted((src, dst) for src, targets in import_graph().items() for dst in targets
                    if LAYER_OF[folder(dst)] > LAYER_OF[folder(src)])
    assert upward == []


def test_no_import_circle():
    graph = import_graph()
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == []


def test_the_checker_sees_the_imports():
    """Guards the two tests above against reading nothing: known edges of the package are found."""
    graph = import_graph()
    assert "promptemb.encoder.pooling" in graph["promptemb.encoder.model"]
    assert "promptemb.common.instantiate" in graph["promptemb.training.runner"]
    assert "promptemb.encoder.model_store" in graph["promptemb.encoder.loading"]
    assert "promptemb.encoder.model_store" in graph["promptemb.encoder.models_command_line"]


def test_training_imports_nothing_from_research():
    """research/ drives training runs (seed reports, mining with a trained encoder); training never needs it."""
    assert [(src, dst) for src, targets in import_graph().items() for dst in targets
            if folder(src) == "training" and folder(dst) == "research"] == []
