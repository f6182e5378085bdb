"""A benchmark's workspace: a scratch directory, the Tiny Shakespeare data in it, and the order
of interleaved repetitions."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def work_dir(keep: str | None, prefix: str) -> Iterator[Path]:
    """`keep` (created, left in place for its logs and outputs), or a temporary directory
    removed at the end."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        yield work


def prepare_shakespeare(work: Path) -> str:
    """Tiny Shakespeare (shipped in the package) prepared into WORK/shakespeare."""
    out = work / "shakespeare"
    tool = REPO / "tools" / "prepare_data.py"
    cmd = [sys.executable, str(tool), "--out_dir", str(out), "--quiet"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {run.returncode}):\n{run.stderr[-4000:]}")
    return str(out)


def interleaved(rows: list[str], reps: int) -> Iterator[tuple[int, str]]:
    """(repetition, row) for every row `reps` times, interleaved so that slow drift of the
    machine falls on every row alike: rep r runs the rows rotated to start at row r."""
    for rep in range(reps):
        for row in rows[rep % len(rows) :] + rows[: rep % len(rows)]:
            yield rep, row
