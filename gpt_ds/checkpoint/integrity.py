"""Checksums of checkpoint files: computed while saving, verified before anything loads.

A file of the right size can still be damaged (a bad disk, a copy interrupted and retried, a
byte flipped in transit); loading it gives NaN losses or a crash that blames something else.
Each rank hashes the files it wrote itself (still in the page cache), and a resume spreads the
verification over the ranks, so a checkpoint costs one extra read of its own share per rank.
SHA-256 because `sha256sum` can check it by hand and CPUs hash it at GB/s (SHA-NI).
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpt_ds.checkpoint.manifest import Manifest

ALGORITHM = "sha256"
_CHUNK = 8 << 20
_RANK_IN_NAME = re.compile(r"rank_?(\d+)")


def file_digest(path: Path) -> str:
    """Hex SHA-256 of a file, read in 8 MiB chunks (constant memory)."""
    h = hashlib.new(ALGORITHM)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def writer_rank(name: str) -> int:
    """The rank that writes `name` in a DeepSpeed/gpt_ds checkpoint: the number in
    `zero_pp_rank_R_...` or `gpt_ds_rankR.pt`; rank 0 for the rest (`mp_rank_00_...`)."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else 0


def digests_of(tag_dir: Path, names: list[str]) -> dict[str, str]:
    return {name: file_digest(Path(tag_dir) / name) for name in names}


def share(sizes: dict[str, int], rank: int, world: int) -> list[str]:
    """The files `rank` verifies: largest first to the least-loaded rank (same on every rank)."""
    load = [0] * world
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = load.index(min(load))
        load[r] += sizes[name]
        if r == rank:
            mine.append(name)
    return mine


def checksum_problems(tag_dir: Path, manifest: Manifest, names: list[str]) -> list[str]:
    """Files among `names` whose content is not what the manifest recorded (present files of
    the right size: `tags.file_problems` checks those first)."""
    if manifest.checksum_algorithm != ALGORITHM:  # saved before checksums, or by another tool
        return []
    if manifest.universal:  # derived from a verified tag, in DeepSpeed's own layout
        return []
    names = [n for n in names if n in manifest.checksums]
    if not names:
        return []
    # one thread per file (reads and hashlib release the GIL): checkpoint files are up to a
    # few GB each, and hashing them one after another on one core took longer than an export
    with ThreadPoolExecutor(min(8, len(names))) as pool:
        digests = pool.map(lambda n: file_digest(Path(tag_dir) / n), names)
        return [
            f"{name} differs from its recorded {ALGORITHM} checksum"
            for name, got in zip(names, digests, strict=True)
            if got != manifest.checksums[name]
        ]
