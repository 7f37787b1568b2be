"""The settings layer's figures (docs/layout.md): measured from the source, at the work tree or at any
commit, with the Python standard library only.

    python scripts/settings_figures.py               # the work tree
    python scripts/settings_figures.py --rev aca28ea # an earlier commit (aca28ea: 1,358 lines of code, 5 modules)
    python scripts/settings_figures.py --json        # the same figures as JSON

1. modules below the command lines that name `DictConfig`, `OmegaConf` or `HydraConfig` (package modules: not the
   tests, benches, scripts, entry scripts or `command_line.py` files);
2. code lines of the check and run-folder files (`CHECK_FILES`): Python lines holding a token, without docstrings
   (found with `ast`), comments and blank lines;
3. string-key reads of raw config dicts outside the settings modules and `build()`: a subscript with a string
   constant (`node["lr"]`) or a `.get("lr", ...)` on a config dict. A config dict is a `dict`-typed field of a command's
   settings (`settings.model`, `self.settings.backbone`, ...), a parameter named like one (`model`, `data`, `backbone`,
   `trainer`, ... or `cfg`, `config`, `node`, `values`), or a local name assigned from either (`model = settings.model
   or {}`), followed through further reads (`data.get("files")`); reads on the evaluate path (evaluate.py's runner,
   its session and what they open) are listed apart.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The files that hold configuration checks or run-folder safety (docs/layout.md's table), and the settings modules
#: added since (each command's settings, its check).
CHECK_FILES = [
    "common/validation.py", "common/cli.py", "common/overrides.py", "common/bounds.py", "common/hydra_bridge.py",
    "encoder/settings.py", "training/settings.py", "evaluation/settings.py", "evaluation/encode_settings.py",
    "exporting/settings.py", "training/command_line.py", "evaluation/command_line.py", "exporting/command_line.py",
    "training/guards.py", "training/run_lock.py", "training/run_dirs.py", "training/lineage.py",
    "common/run_folder.py",
]
#: Folders that are not the package (or are its command lines, which talk to Hydra by design).
NOT_PACKAGE = ("tests/", "bench/", "scripts/", "promptemb/")
ENTRY_SCRIPTS = ("train.py", "evaluate.py", "export.py")
CONFIG_NAMES = re.compile(r"DictConfig|OmegaConf|HydraConfig")
#: Names of raw config dicts: the dict-typed settings fields and the generic names of a composed config's values.
DICT_NAMES = {"model", "optimizer", "scheduler", "data", "trainer", "callbacks", "logger", "backbone", "resolved",
              "pooler_args", "post_args", "transfer_args", "clustering_args", "cfg", "config", "node", "values"}
#: Modules exempt from the read count: the settings modules and checks (they turn raw values into typed ones).
SETTINGS_MODULES = re.compile(r"(^|/)(settings|encode_settings|command_line|validation|cli|hydra_bridge)\.py$")
#: evaluate.py's path below its settings: the runner and what it calls to score or encode.
EVALUATE_PATH = ("evaluation/runner.py", "evaluation/session.py", "inference/model_sources.py", "encoder/model.py",
                 "encoder/loading.py", "poolers/registry.py", "postprocessing/registry.py")


def files(rev: str | None) -> list[str]:
    command = ["git", "ls-tree", "-r", "--name-only", rev] if rev else ["git", "ls-files"]
    return [path for path in subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                            check=True).stdout.split() if path.endswith(".py")]


def source(path: str, rev: str | None) -> str | None:
    if rev is None:
        file = REPO / path
        return file.read_text(encoding="utf-8") if file.is_file() else None
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def below_the_command_lines(path: str) -> bool:
    return not path.startswith(NOT_PACKAGE) and path not in ENTRY_SCRIPTS and not path.endswith("command_line.py")


def config_object_modules(rev: str | None) -> list[str]:
    return [path for path in files(rev) if below_the_command_lines(path) and CONFIG_NAMES.search(source(path, rev))]


def docstring_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(text: str) -> int:
    """Lines holding a token of code: not blank, not only a comment, not part of a docstring."""
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENCODING, tokenize.ENDMARKER}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines(ast.parse(text)))


def is_config_dict(node: ast.expr, names: set[str]) -> bool:
    """`settings.model`, `self.settings.backbone`, a config-dict name, or a read of one (`data.get("x")`)."""
    while isinstance(node, ast.BoolOp):  # `settings.model or {}`
        node = node.values[0]
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in DICT_NAMES and isinstance(node.value, ast.Name | ast.Attribute) and (
            "settings" in ast.unparse(node.value).split(".")[-1])
    return string_key_read(node, names) is not None


def string_key_read(node: ast.AST, names: set[str]) -> str | None:
    """The key of `x["key"]` or `x.get("key", ...)` where x is a config dict; None otherwise."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value if is_config_dict(node.value, names) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value if is_config_dict(node.func.value, names) else None
    return None


def config_reads(text: str) -> list[tuple[int, str]]:
    """(line, source) of each string-key read of a raw config dict outside `build()` functions."""
    found = []
    for function in ast.walk(ast.parse(text)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or function.name == "build":
            continue
        names = {arg.arg for arg in function.args.args + function.args.kwonlyargs if arg.arg in DICT_NAMES}
        for statement in ast.walk(function):  # local names bound to a config dict (in source order is enough here)
            if isinstance(statement, ast.Assign):
                pairs = [(target, statement.value) for target in statement.targets]
                pairs += [pair for target in statement.targets if isinstance(target, ast.Tuple)
                          and isinstance(statement.value, ast.Tuple) for pair in zip(target.elts, statement.value.elts)]
                names.update(target.id for target, value in pairs
                             if isinstance(target, ast.Name) and is_config_dict(value, names))
            if isinstance(statement, ast.NamedExpr) and is_config_dict(statement.value, names):
                names.add(statement.target.id)
        inner = {id(node) for child in function.body for node in ast.walk(child)
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        for node in ast.walk(function):
            if id(node) not in inner and string_key_read(node, names) is not None:
                found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


def figures(rev: str | None) -> dict:
    lines = {path: code_lines(text) for path in CHECK_FILES if (text := source(path, rev)) is not None}
    reads = {}
    for path in files(rev):
        if below_the_command_lines(path) and not SETTINGS_MODULES.search(path):
            for line, text in config_reads(source(path, rev)):
                reads.setdefault(path, []).append(f"{line}: {text}")
    return {"config_object_modules": config_object_modules(rev), "code_lines": lines,
            "code_lines_total": sum(lines.values()), "config_reads": reads,
            "config_reads_total": sum(map(len, reads.values())),
            "config_reads_evaluate_path": sum(len(v) for k, v in reads.items() if k in EVALUATE_PATH)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default=None, help="a commit to measure (default: the work tree)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = figures(args.rev)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"modules below the command lines naming DictConfig/OmegaConf/HydraConfig: "
          f"{len(result['config_object_modules'])} ({', '.join(result['config_object_modules'])})")
    print(f"code lines of the check and run-folder files: {result['code_lines_total']:,}")
    for path, count in result["code_lines"].items():
        print(f"  {count:5d}  {path}")
    print(f"string-key reads of raw config dicts outside the settings modules and build(): "
          f"{result['config_reads_total']} (evaluate's path: {result['config_reads_evaluate_path']})")
    for path, reads in result["config_reads"].items():
        for read in reads:
            print(f"  {path}:{read}")


if __name__ == "__main__":
    main()
