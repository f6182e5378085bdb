"""What the benchmark scripts share: a scratch directory, the Tiny Shakespeare data, and a
process's memory figures from /proc (the same measure for gpt_ds and for its peers)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    subprocess.run(cmd, check=True, cwd=REPO, capture_output=True)
    return str(out)


def status_bytes(pid: int, field: str) -> int:
    """A memory field of /proc/PID/status (VmHWM: peak resident set; RssAnon: anonymous
    memory), in bytes; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next((x for x in f if x.startswith(f"{field}:")), f"{field}: 0 kB")
    except OSError:
        return 0
    return int(line.split()[1]) * 1024
