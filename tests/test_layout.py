"""The design rules of the package, checked: small modules, short functions on the training
path, an import graph without cycles in which nothing imports the entry point, and tests that
import helpers, never other tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "gpt_ds"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
TRAINING_PATH = ["train.py", "trainer.py", "report.py", "stop.py", "checkpoint"]


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The package modules `path` imports, at any depth of the file (lazy imports count)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_small(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"


def training_path_functions():
    for entry in TRAINING_PATH:
        target = PACKAGE / entry
        for path in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{path.relative_to(REPO)}:{node.name}", node


@pytest.mark.parametrize("where,node", list(training_path_functions()), ids=lambda x: str(x))
def test_training_path_function_is_short(where, node):
    lines = node.end_lineno - node.lineno + 1
    assert lines <= MAX_FUNCTION_LINES, f"{where}: {lines} lines"


def test_import_graph_has_no_cycles_and_nothing_imports_the_entry_point():
    mods = modules()
    graph = {name: imported_modules(path, set(mods)) - {name} for name, path in mods.items()}
    # a package's __init__ re-exports its modules: importing it is importing them
    importers_of_train = sorted(n for n, deps in graph.items() if "gpt_ds.train" in deps)
    assert importers_of_train == [], f"modules import the entry point: {importers_of_train}"
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if dep.startswith(name + "."):  # a package importing its own modules
                continue
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep] if dep in path else path + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_no_module_imports_a_test_module():
    offenders = []
    for path in [*(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(REPO)}: {n}"
                for n in names
                if n.split(".")[-1].startswith("test_") or n == "conftest"
            ]
    assert offenders == []
