"""Every file under a folder with its SHA-256: "byte-identical afterwards", checked."""

from __future__ import annotations

from pathlib import Path

from gpt_ds.checkpoint.integrity import file_digest


def file_hashes(root: Path, exclude: str | None = None) -> dict[str, str]:
    """{path relative to `root`: sha256} of every file under `root`, but those under the
    top-level folder `exclude`."""
    return {
        str(p.relative_to(root)): file_digest(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != exclude
    }
