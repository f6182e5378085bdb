"""The code base stays ruff clean (lint and format), so CI catches style drift too."""

from __future__ import annotations

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
