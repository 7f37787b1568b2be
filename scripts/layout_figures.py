"""The layout's figures (docs/layout.md), measured from the source at the work tree or at any commit, with the
standard library only:

    python scripts/layout_figures.py [--rev COMMIT] [--json]
    python scripts/layout_figures.py --touched A..B     # the files a range of commits touched, by kind

1. code lines of the configuration checking: the files whose concern is checking a command's configuration (the
   settings modules, the command lines and their shared checks: `CHECK_FILES`, those that exist at the revision) and
   every `check_*` function or method elsewhere in the package;
2. code lines of the run-folder code: the modules of a training run's folder (`RUN_FOLDER_FILES`: where it is, its
   lock, its lineage, its outcome and records, resuming into it, what a failed run leaves);
3. package modules outside lightning_modules/ that name a recipe: import a module defining one, or name a recipe
   class (a class of lightning_modules/ deriving from `PromptContrastiveModule`);
4. `--touched`: the files a range of commits changed, as a recipe's module, its YAML files, its tests, or other.

Code lines: lines holding a token of code (no blank lines, comments or docstrings, found with `ast` and `tokenize`).
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

CHECK_FILES = [
    "common/validation.py", "common/cli.py", "common/overrides.py", "common/bounds.py", "common/hydra_bridge.py",
    "encoder/settings.py", "training/settings.py", "evaluation/settings.py", "exporting/settings.py",
    "training/command_line.py", "evaluation/command_line.py", "inference/command_line.py",
    "exporting/command_line.py",
]
RUN_FOLDER_FILES = [
    "training/run_folder.py", "training/guards.py", "training/run_lock.py", "training/run_dirs.py",
    "training/lineage.py", "training/trials.py", "training/checkpointing.py", "training/rng_state.py",
    "common/run_folder.py", "common/run_context.py", "common/output_dirs.py", "common/io.py",
]
NOT_PACKAGE = ("tests/", "bench/", "scripts/", "examples/", "docs/", "configs/", "promptemb/")
ENTRY_SCRIPTS = ("train.py", "evaluate.py", "export.py")
BASE_RECIPE = "PromptContrastiveModule"


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


def docstring_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_line_numbers(text: str) -> set[int]:
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENCODING, tokenize.ENDMARKER}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstring_lines(ast.parse(text))


def package_files(rev: str | None) -> list[str]:
    return [path for path in files(rev) if not path.startswith(NOT_PACKAGE) and path not in ENTRY_SCRIPTS]


def checking_lines(rev: str | None) -> dict:
    whole = {path: len(code_line_numbers(text)) for path in CHECK_FILES if (text := source(path, rev)) is not None}
    functions: dict[str, int] = {}
    for path in package_files(rev):
        if path in whole or (text := source(path, rev)) is None:
            continue
        numbers = code_line_numbers(text)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.lstrip("_").startswith(
                    "check"):
                functions[f"{path}:{node.name}"] = len(numbers & set(range(node.lineno, node.end_lineno + 1)))
    return {"files": whole, "check_functions": len(functions), "check_function_lines": sum(functions.values()),
            "total": sum(whole.values()) + sum(functions.values())}


def run_folder_lines(rev: str | None) -> dict:
    found = {path: len(code_line_numbers(text)) for path in RUN_FOLDER_FILES
             if (text := source(path, rev)) is not None}
    return {"files": found, "total": sum(found.values())}


def recipes(rev: str | None) -> tuple[set[str], set[str]]:
    """(recipe class names, modules defining them) of lightning_modules/ at the revision."""
    bases: dict[str, tuple[str, list[str]]] = {}
    for path in files(rev):
        if path.startswith("lightning_modules/") and (text := source(path, rev)) is not None:
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef):
                    names = [base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
                             for base in node.bases]
                    bases[node.name] = (path, names)
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, (_, parents) in bases.items():
            if name not in found and (BASE_RECIPE in parents or found & set(parents)):
                found.add(name)
                changed = True
    modules = {"promptemb." + bases[name][0].removesuffix(".py").replace("/", ".") for name in found}
    return found, modules


def recipe_naming_modules(rev: str | None) -> list[str]:
    """Modules that name a recipe in code: import a module defining one, or use a recipe class's name (an identifier,
    an attribute, or a string holding the name: a class path switched on); docstrings and comments that cite a
    method are not code."""
    names, modules = recipes(rev)
    naming = []
    for path in package_files(rev):
        if path.startswith("lightning_modules/") or (text := source(path, rev)) is None:
            continue
        tree = ast.parse(text)
        documented = docstring_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                hit = True
            elif isinstance(node, ast.Import):
                hit = any(alias.name in modules for alias in node.names)
            elif isinstance(node, ast.Name | ast.Attribute):
                hit = (node.id if isinstance(node, ast.Name) else node.attr) in names
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno not in documented:
                hit = any(re.search(rf"(^|[.\s]){re.escape(name)}$", node.value) for name in names) or any(
                    module.rsplit(".", 1)[-1] in node.value.split(".") and "lightning_modules" in node.value
                    for module in modules)
            else:
                hit = False
            if hit:
                naming.append(path)
                break
    return naming


def touched(commits: str) -> dict[str, list[str]]:
    changed = subprocess.run(["git", "diff", "--name-only", commits], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    kinds: dict[str, list[str]] = {"module": [], "yaml": [], "tests": [], "docs": [], "other": []}
    for path in changed:
        kind = ("tests" if path.startswith("tests/") else "yaml" if path.startswith("configs/") else
                "docs" if path.startswith("docs/") or path.endswith(".md") else
                "module" if path.startswith("lightning_modules/") else "other")
        kinds[kind].append(path)
    return kinds


def figures(rev: str | None) -> dict:
    return {"checking": checking_lines(rev), "run_folder": run_folder_lines(rev),
            "recipe_naming_modules": recipe_naming_modules(rev), "recipes": sorted(recipes(rev)[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default=None, help="a commit to measure (default: the work tree)")
    parser.add_argument("--touched", help="a commit range A..B: the files it changed, by kind")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.touched:
        result = touched(args.touched)
        print(json.dumps(result, indent=1) if args.json else "\n".join(
            f"{kind}: {len(paths)}  {' '.join(paths)}" for kind, paths in result.items()))
        return
    result = figures(args.rev)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    checking, folder = result["checking"], result["run_folder"]
    print(f"configuration checking: {checking['total']:,} code lines ({len(checking['files'])} files, "
          f"{checking['check_functions']} check functions elsewhere: {checking['check_function_lines']} lines)")
    for path, count in checking["files"].items():
        print(f"  {count:5d}  {path}")
    print(f"run-folder code: {folder['total']:,} code lines in {len(folder['files'])} modules")
    for path, count in folder["files"].items():
        print(f"  {count:5d}  {path}")
    naming = result["recipe_naming_modules"]
    print(f"modules outside lightning_modules/ naming a recipe ({len(result['recipes'])} recipes): {len(naming)}"
          + (f" ({', '.join(naming)})" if naming else ""))


if __name__ == "__main__":
    main()
