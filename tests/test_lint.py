"""The code base stays ruff clean (lint and format) and type-checks with mypy (the
[tool.mypy] section of pyproject.toml), so CI catches style drift and type errors too."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.parametrize("mode", [["check"], ["format", "--check"]])
def test_ruff_clean(mode):
    assert RUFF, "ruff is missing: install the dev extra (pip install -e '.[dev]')"
    proc = subprocess.run(
        [RUFF, *mode, "gpt_ds", "tools", "tests", "benchmarks"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_clean():
    """`python -m mypy` from the root checks what pyproject.toml names (gpt_ds/): about 20 s
    on 2 CPU cores the first time, about 1 s once .mypy_cache/ holds the libraries' types."""
    assert importlib.util.find_spec("mypy"), "mypy is missing: install the dev extra"
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pre_commit_runs_the_suites_checks():
    """.pre-commit-config.yaml runs ruff (lint and format), mypy and shellcheck on launchers/."""
    import yaml

    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff", "ruff-format", "mypy", "shellcheck"} <= set(hooks), sorted(hooks)
    assert hooks["shellcheck"]["files"] == "^launchers/"
    assert hooks["mypy"]["pass_filenames"] is False  # the whole package, as the suite checks it


def test_no_dead_code_in_the_package():
    """vulture finds nothing in gpt_ds/ that no code calls: benchmarks/ and tools/ count as
    callers, the tests do not (code only a test calls belongs in the test). What only
    something outside Python reads is listed, with who reads it, in tests/dead_code_allowed.py.
    """
    assert importlib.util.find_spec("vulture"), "vulture is missing: install the dev extra"
    paths = ["gpt_ds", "benchmarks", "tools", "tests/dead_code_allowed.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "vulture", *paths, "--min-confidence", "60"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    dead = [line for line in proc.stdout.splitlines() if line.startswith("gpt_ds/")]
    assert dead == [], "\n".join(dead)
