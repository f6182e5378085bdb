"""`pytest` changes nothing outside the checkout and temp dirs unless GPT_DS_TEST_SYSTEM=1
(helpers/system.py): no apt-get, no mount, no ~/.ssh/config write without it. Held two ways:
the code (every such change is made in helpers/system.py, or by the loopback sshd that checks
the opt-in first), and a real pytest run without the opt-in of tests that need each change,
which skip naming the variable while ~/.ssh/config and the mount table stay as they were.
pip's cache (and the other tools' caches) goes to the suite's temp dir (conftest), never
~/.cache/pip: every pip the tests spell passes --no-cache-dir, and a pip that does cache, run
as the tests run it, caches there and leaves ~/.cache/pip as it was."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from helpers.sshd import ssh_config_path
from helpers.system import OPT_IN

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "helpers"
# a command that changes the machine, as a test would spell it
SYSTEM_COMMAND = re.compile(r"""["'](apt-get|apt|mount|umount|useradd|sysctl)["',\s]""")
SSH_DIR = re.compile(r"""["']\.ssh["'/]""")  # ~/.ssh, as code spells it (not a comment)


def python_files() -> list[Path]:
    return sorted([*(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")])


def test_every_system_change_is_made_by_the_opt_in_helpers():
    """apt-get and mount(8) only in helpers/system.py; ~/.ssh/config (and the mounts of a
    node's own namespace) only in helpers/sshd.py, held below; this file only reads it."""
    owners = {HELPERS / "system.py", HELPERS / "sshd.py", Path(__file__)}
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in python_files()
        if p not in owners
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SYSTEM_COMMAND.search(line) or SSH_DIR.search(line) or "ssh_config_path" in line
    ]
    assert found == []
    sshd = (HELPERS / "sshd.py").read_text()
    assert "apt-get install" not in sshd and "ensure_packages(PACKAGES)" in sshd


def test_the_loopback_sshd_checks_the_opt_in_before_anything():
    """sshd.py edits ~/.ssh/config and mounts in its sshd's namespace: only objects `_start`
    makes do, and `_start` asks first."""
    tree = ast.parse((HELPERS / "sshd.py").read_text())
    start = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_start")
    first = start.body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
    assert ast.unparse(first.value.func) == "check_allowed"
    makers = {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef)
        and any(ast.unparse(c.func) == "SshLoopback" for c in calls(n))
    }
    assert makers == {"_start"}


def calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def machine_state() -> tuple[str, str]:
    config = ssh_config_path()
    text = config.read_bytes() if config.exists() else b""
    return hashlib.sha256(text).hexdigest(), Path("/proc/self/mounts").read_text()


NEED_CHANGES = [
    "tests/test_faults.py::test_read_only_out_dir_fails_before_training",  # a bind mount
    "tests/test_two_node.py::test_pdsh_ranks_get_the_venv_python_and_deepspeed_env",  # sshd
]


# alone: the other worker of `pytest -n 2` would otherwise mount or start the sshd meanwhile
@pytest.mark.alone
def test_without_the_opt_in_those_tests_skip_and_change_nothing(tmp_path):
    # a pytest of its own, not one more xdist worker
    env = {k: v for k, v in os.environ.items() if k != OPT_IN and not k.startswith("PYTEST_XDIST")}
    before = machine_state()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", *NEED_CHANGES],
        cwd=REPO,
        env={**env, "PYTEST_ADDOPTS": f"--basetemp={tmp_path / 'base'}"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    assert " passed" not in said.splitlines()[-1], said[-4000:]  # every one skipped
    skips = [line for line in said.splitlines() if line.startswith("SKIPPED")]
    assert skips and all(f"set {OPT_IN}=1 to allow it" in line for line in skips), skips
    assert machine_state() == before


# pip's subcommands that write its cache: downloads (HTTP cache) and the wheels it builds
PIP_CACHING = {"install", "wheel", "download"}


def pip_commands(path: Path) -> list[tuple[int, list[str]]]:
    """(line, words) of each pip command `path` spells: a list or tuple literal whose strings
    hold "pip" followed by a subcommand that writes pip's cache."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List | ast.Tuple):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            words = [w for w in words if isinstance(w, str)]
            if any(a == "pip" and b in PIP_CACHING for a, b in zip(words, words[1:], strict=False)):
                found.append((node.lineno, words))
    return found


def test_every_pip_the_tests_run_passes_no_cache_dir():
    commands = [(p, line, words) for p in python_files() for line, words in pip_commands(p)]
    assert len(commands) >= 4  # test_install, test_runtime_deps, test_wheelhouse, helpers/venvs
    without = [
        f"{p.relative_to(REPO)}:{line}" for p, line, w in commands if "--no-cache-dir" not in w
    ]
    assert without == []


def tree(folder: Path) -> list[tuple[str, int, int]] | None:
    """Each file under `folder` with its size and mtime (None: no such folder)."""
    if not folder.exists():
        return None
    return sorted(
        (str(p.relative_to(folder)), p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in folder.rglob("*")
    )


PROBE_BACKEND = """
import os, zipfile
META = {"METADATA": "Metadata-Version: 2.1|Name: gptdsprobe|Version: 1.0|",
        "WHEEL": "Wheel-Version: 1.0|Root-Is-Purelib: true|Tag: py3-none-any|", "RECORD": ""}
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "gptdsprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for file, text in META.items():
            wheel.writestr("gptdsprobe-1.0.dist-info/" + file, text.replace("|", chr(10)))
    return name
"""


def probe_sdist(folder: Path) -> Path:
    """A sdist pip builds offline with its own in-tree backend (no setuptools needed), and
    whose wheel pip keeps in its cache (an sdist named NAME-VERSION.tar.gz is cacheable)."""
    source = folder / "gptdsprobe-1.0"
    source.mkdir(parents=True)
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (source / "backend.py").write_text(PROBE_BACKEND)
    sdist = folder / "gptdsprobe-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(source, arcname=source.name)
    return sdist


def test_pip_caches_in_the_suites_temp_dir_and_leaves_home_as_it_was(tmp_path):
    """A pip that writes its cache (a wheel built from a sdist), run as the tests run a
    process (this environment, no --no-cache-dir on purpose): the wheel lands in the suite's
    temp dir, and ~/.cache/pip is unchanged."""
    home = tree(Path.home() / ".cache" / "pip")
    cache = Path(os.environ["PIP_CACHE_DIR"])
    assert Path(tempfile.gettempdir()).resolve() in cache.resolve().parents, cache
    sdist = probe_sdist(tmp_path / "src")
    # spelled as words: the one pip of the suite without --no-cache-dir (the check above)
    build = f"-m pip wheel --quiet --no-deps --no-build-isolation --no-index -w {tmp_path}"
    subprocess.run([sys.executable, *build.split(), str(sdist)], cwd=tmp_path, check=True)
    assert list(cache.rglob("gptdsprobe-1.0-*.whl")), "pip cached nothing: the check proves nothing"
    assert tree(Path.home() / ".cache" / "pip") == home
