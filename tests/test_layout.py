"""The design rules of the package, checked: subpackages in layers (none imports a layer above
it), few modules beside them, an import graph without cycles in which nothing imports the entry
point, a short path from `main()` to the optimizer step (few modules imported, few files run),
a resolution that asks the machine nothing (launch/machine.py asks, once), a layout table
(docs/development.md) that lists every subpackage, and tests that import helpers, never other
tests. Beside the package: every module of benchmarks/support/ serves a benchmark, the
benchmarks launch through the `deepspeed` command a user runs (never the suite's lean launcher
or zygote, tests/harness/), and the tests through that harness. Modules and functions have no
line caps: a module is as long as its one job."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.launch import run_python
from support.launch import tiny_run_args

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "gpt_ds"
# The subpackages, bottom layer first: a module may import its own subpackage and those listed
# before it, never one after it. `train.py` (the entry point) sits above them all.
LAYERS = [
    "base",  # errors, process group, CLI style: used everywhere
    "model",  # GPT-2 shapes, construction, the chunked loss
    "data",  # tokenizer, token files, training windows, mixtures; data/prepare
    "dsconfig",  # the DeepSpeed config: schema, RunSettings, every "auto" from the machine's facts
    "memory",  # the ZeRO memory and communication model, the guard, the picker
    "observe",  # metrics, monitors, start-up report, plots
    "checkpoint",  # save protocol, manifest, tags, universal conversion
    "export",  # Hugging Face export, generation
    "launch",  # the machine's facts, hostfile, preflight, GPU support, rank counts
    "run",  # the run config and what it resolves to
    "training",  # the trainer
    "commands",  # one module per console script
]
MAX_TOP_LEVEL_MODULES = 4
# `import gpt_ds.train` and a one-process run up to its first optimizer step: what only some
# runs need (the picker, plots, profiling, compile, ZeRO-3's build...) is imported where used
MAX_TRAIN_IMPORTS = 50
MAX_STEP_PATH_FILES = 30  # counted in every thread the run starts


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


# What only launch/machine.py may ask: the environment, the accelerator, the CPU, the network
# and the installed compilers. The resolution (dsconfig/, memory/, run/plan.py) reads its facts.
PROBING_MODULES = {"subprocess", "netrc", "socket", "platform", "deepspeed.accelerator"}
PROBING_ATTRIBUTES = {"environ", "getenv", "cuda", "which"}  # os.environ, torch.cuda, ...
PROBING_NAMES = {"get_accelerator", "print"}
RESOLUTION = ["gpt_ds/dsconfig/*.py", "gpt_ds/memory/*.py", "gpt_ds/run/plan.py"]


def machine_questions(path: Path) -> list[str]:
    """`file:line what` for each probing module `path` imports, attribute or name it uses, and
    each /proc path it spells."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        hits: list[str] = []
        if isinstance(node, ast.Import):
            hits = [a.name for a in node.names if a.name in PROBING_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(a.name for a in node.names)]
            hits = [n for n in names if n in PROBING_MODULES | PROBING_NAMES]
        elif isinstance(node, ast.Attribute) and node.attr in PROBING_ATTRIBUTES:
            hits = ["." + node.attr]
        elif isinstance(node, ast.Name) and node.id in PROBING_NAMES:
            hits = [node.id]
        elif isinstance(node, ast.Constant) and str(node.value).startswith("/proc/"):
            hits = [node.value]
        found += [f"{path.relative_to(REPO)}:{node.lineno} {hit}" for hit in hits]
    return found


def test_the_resolution_asks_the_machine_nothing():
    """The machine is probed once, by launch/machine.py, into `MachineFacts`; the config's
    resolution, the memory model and guard, and the plan read those facts and ask nothing
    themselves (no environment, accelerator, /proc, network, compiler or printing), so they
    resolve the same for a machine they are not on (the picker's)."""
    files = sorted(p for pattern in RESOLUTION for p in REPO.glob(pattern))
    assert len(files) > 5, files
    found = [hit for path in files for hit in machine_questions(path)]
    assert found == [], "\n".join(found)
    probe = machine_questions(PACKAGE / "launch" / "machine.py")
    assert any("get_accelerator" in hit for hit in probe), probe  # the check can see a probe


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


def subpackage(module: str) -> str | None:
    """`gpt_ds.data.prepare.encode` -> "data"; None for a module directly in gpt_ds/."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() else None


def test_subpackages_are_the_layers_and_none_imports_a_layer_above_it():
    mods = modules()
    found = {subpackage(m) for m in mods} - {None, "ds_configs"}
    assert found == set(LAYERS), f"subpackages not in LAYERS (or gone): {found ^ set(LAYERS)}"
    upward = []
    for name, path in mods.items():
        here = subpackage(name)
        if here is None:
            continue
        for dep in imported_modules(path, set(mods)):
            there = subpackage(dep)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{name} imports {dep} ({here} < {there})")
    assert upward == [], "\n".join(upward)


def test_few_modules_beside_the_subpackages():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES and "train.py" in top, top


def test_importing_the_entry_point_loads_few_modules():
    """`import gpt_ds.train` loads what every run needs, not what only some do."""
    code = "import sys, gpt_ds.train; print(' '.join(m for m in sys.modules if m[:7] == 'gpt_ds.'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = proc.stdout.split()
    assert len(loaded) <= MAX_TRAIN_IMPORTS, f"{len(loaded)} modules: {sorted(loaded)}"


@pytest.mark.slow
def test_the_path_from_main_to_the_first_step_crosses_few_files(shakespeare_dir, tmp_path):
    """A one-process gpt2-tiny run, traced from `main()` to DeepSpeed's first `engine.step()`
    (tests/scripts/trace_step_path.py, in every thread): the gpt_ds files whose functions ran
    are few, and
    docs/development.md lists each of them (its "Path to the step")."""
    out = tmp_path / "trace.json"
    args = tiny_run_args(
        shakespeare_dir, tmp_path / "run", max_iters=2, warmup_iters=1, eval_interval=0
    )
    run_python([str(REPO / "tests" / "scripts" / "trace_step_path.py"), str(out), "--", *args])
    files = json.loads(out.read_text())["files"]
    assert len(files) <= MAX_STEP_PATH_FILES, f"{len(files)} files: {files}"
    page = (REPO / "docs" / "development.md").read_text()
    path_section = page[page.index("## Path to the step") :]
    unlisted = [f for f in files if f"`{f.removeprefix('gpt_ds/')}`" not in path_section]
    assert unlisted == [], f"docs/development.md's path to the step lacks {unlisted}"


def test_layout_table_lists_every_subpackage():
    page = (REPO / "docs" / "development.md").read_text()
    table = page[page.index("## Layout") : page.index("## Words in the code")]
    missing = [layer for layer in LAYERS if f"`gpt_ds/{layer}/`" not in table]
    assert missing == [], f"docs/development.md's layout table lacks {missing}"


def test_contributing_lists_the_layers_in_this_order():
    """CONTRIBUTING.md's "Layers" list, bottom first, is LAYERS."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text[text.index("## Layers") :]
    section = section[: section.index("\n## ", 1)]
    listed = re.findall(r"^\d+\. `(\w+)`", section, re.M)
    assert listed == LAYERS, f"CONTRIBUTING.md lists {listed}; tests/test_layout.py: {LAYERS}"


def test_benchmarks_import_their_support_not_the_tests_nor_each_other():
    scripts = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    offenders = []
    for path in (REPO / "benchmarks").rglob("*.py"):
        text = path.read_text()
        if '"tests"' in text or "'tests'" in text:
            offenders.append(f"{path.relative_to(REPO)}: names tests/ (on sys.path?)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                top = node.module.split(".")[0]
            elif isinstance(node, ast.Import):
                top = node.names[0].name.split(".")[0]
            else:
                continue
            if top in ("helpers", "harness") or top in scripts:
                offenders.append(f"{path.relative_to(REPO)}: imports {top}")
    assert offenders == []


def support_imports(path: Path) -> set[str]:
    """The benchmarks/support/ modules `path` imports (`support.X`, at any depth of the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "support":
            names = [f"support.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.startswith("support.")}
    return found


def test_every_benchmark_support_module_serves_a_benchmark():
    """Each module of benchmarks/support/ is imported by a benchmark script, itself or through
    another support module: what only the tests use lives in tests/ (helpers/, harness/)."""
    support = REPO / "benchmarks" / "support"
    reached: set[str] = set()
    todo = sorted((REPO / "benchmarks").glob("*.py"))
    while todo:
        for name in support_imports(todo.pop()) - reached:
            reached.add(name)
            todo.append(support / f"{name}.py")
    modules = {p.stem for p in support.glob("*.py")} - {"__init__"}
    assert sorted(modules - reached) == [], "benchmarks/support/ modules no benchmark imports"


def code_words(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, word) of a module's code: names, attributes, keywords, imported modules and the
    string literals that are not docstrings (a docstring may say what the code does not do)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.lineno, node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.lineno, node.arg
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.alias):
            yield node.lineno, node.name


# The test suite's launch shortcuts, as code would name them: its lean node launcher, the
# zygote that forks its ranks, the option that chose them
SUITE_SHORTCUTS = re.compile(r"node_launcher|zygote|harness|\blean\b", re.I)


def test_benchmarks_launch_through_the_deepspeed_command():
    """A benchmark measures what a user runs: its launches are the `deepspeed` command
    (support/launch.py's `deepspeed_command`), never the suite's lean node launcher or its
    zygote, nor DeepSpeed's per-node launcher without its runner (`-m
    deepspeed.launcher.launch`)."""
    offenders = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for line, word in code_words(tree):
            if SUITE_SHORTCUTS.search(word):
                offenders.append(f"{path.relative_to(REPO)}:{line}: {word}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple)):
                items = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                pairs = zip(items, items[1:], strict=False)
                if ("-m", "deepspeed.launcher.launch") in pairs:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: -m launcher.launch")
    assert offenders == []


def test_tests_launch_through_the_suites_launcher():
    """Tests take `run_deepspeed`, `run_python` and `Launch` from tests/harness/launch.py (the
    lean node launcher, ranks forked by the zygote), not benchmarks/support/'s, which start
    what a user's `deepspeed` does and cost the suite seconds a launch."""
    slow = {"run_deepspeed", "run_python", "Launch"}
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if "harness" in path.relative_to(REPO / "tests").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("support"):
                found = slow & {a.name for a in node.names}
                offenders += [f"{path.relative_to(REPO)}: {n} from {node.module}" for n in found]
    assert offenders == []


def test_the_benchmark_group_is_exactly_the_modules_that_run_a_benchmark():
    """`pytest -m bench` runs the scripts' smoke tests, and `-m "slow and not bench"` the rest."""
    wrong = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        runs_one = "run_benchmark(" in text
        if runs_one != ("pytestmark = pytest.mark.bench" in text):
            wrong.append(path.name)
    assert wrong == [], f"bench marker and run_benchmark disagree in {wrong}"


# A file name in a docstring or comment: a module or script path (`run/plan.py`, `plan.py`)
NAMED_FILE = re.compile(r"(?<![\w./-])([a-z][\w/]*/)?([a-z_0-9]+\.py)\b")  # not `tools/X.py`
# files of other projects the code names, with the project on the same line
OTHER_PROJECTS = ("llama.cpp", "convert_hf_to_gguf", "nanoGPT", "build-nanogpt")
# the pages people read, beside the code's docstrings and comments
DOC_PAGES = ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md", "ds_configs/README.md", "docs/*.md"]


def python_files_of(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def test_every_file_the_code_names_exists():
    """Docstrings and comments of gpt_ds/, benchmarks/ and tools/, and the docs (DOC_PAGES; not
    the CHANGELOG, whose history names files since gone), name modules that exist: in
    this repository (a path's tail is enough: `run/plan.py`, `plan.py`), or in DeepSpeed,
    transformers, torch or tiktoken as installed with that package named on the line (its name
    or its path: a bare `schedule.py` is not DeepSpeed's pipeline schedule), or with the other
    project named on the line."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    ours = [str(p.relative_to(REPO)) for p in python_files_of("gpt_ds", "benchmarks", "tools",
                                                              "tests")]  # fmt: skip
    theirs = {
        package: [str(p.relative_to(site)) for p in (site / package).rglob("*.py")]
        for package in ("deepspeed", "transformers", "torch", "tiktoken_ext")
    }

    def found(name: str, files: list[str]) -> bool:
        return any(k == name or k.endswith("/" + name) for k in files)

    missing = []
    pages = sorted(p for pattern in DOC_PAGES for p in REPO.glob(pattern))
    for path in [*python_files_of("gpt_ds", "benchmarks", "tools"), *pages]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(project in line for project in OTHER_PROJECTS):
                continue
            for name in ("".join(parts) for parts in NAMED_FILE.findall(line)):
                named = [pkg for pkg, files in theirs.items() if pkg.split("_")[0] in line.lower()]
                if not found(name, ours) and not any(found(name, theirs[p]) for p in named):
                    missing.append(f"{path.relative_to(REPO)}:{n}: {name}")
    assert missing == []
