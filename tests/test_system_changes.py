"""`pytest` changes nothing outside the checkout and temp dirs unless GPT_DS_TEST_SYSTEM=1
(helpers/system.py): no apt-get, no mount, no ~/.ssh/config write without it. Held two ways:
the code (every such change is made in helpers/system.py, or by the loopback sshd that checks
the opt-in first), and a real pytest run without the opt-in of tests that need each change,
which skip naming the variable while ~/.ssh/config and the mount table stay as they were."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
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
