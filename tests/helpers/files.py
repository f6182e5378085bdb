"""Every file under a folder with its SHA-256: "byte-identical afterwards", checked."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_hashes(root: Path, exclude: str | None = None) -> dict[str, str]:
    """{path relative to `root`: sha256} of every file under `root`, but those under the
    top-level folder `exclude`."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != exclude
    }
