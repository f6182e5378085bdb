"""Every file under a folder with its SHA-256: "byte-identical afterwards", checked; the suite's
own data files."""

from __future__ import annotations

from pathlib import Path

from gpt_ds.checkpoint.integrity import file_digest

# HellaSwag's format, 12 examples written for the suite: one context longer than a 64-token
# block, one ending too long for it (test_hellaswag.py; conftest.stage_run scores it)
HELLASWAG_MINI = Path(__file__).parents[1] / "data" / "hellaswag_mini.jsonl"


def file_hashes(root: Path, exclude: str | None = None) -> dict[str, str]:
    """{path relative to `root`: sha256} of every file under `root`, but those under the
    top-level folder `exclude`."""
    return {
        str(p.relative_to(root)): file_digest(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != exclude
    }
