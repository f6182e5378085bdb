"""Checksums of checkpoint files: computed while saving, verified before anything loads.

A file of the right size can still be damaged (a bad disk, a copy interrupted and retried, a
byte flipped in transit); loading it gives NaN losses or a crash that blames something else.
Each rank hashes the files it wrote itself (still in the page cache), and a resume spreads the
verification over the ranks, so a checkpoint costs one extra read of its own share per rank.
SHA-256 because `sha256sum` can check it by hand and CPUs hash it at GB/s (SHA-NI).

It fails closed: a manifest without a checksum for each of its files (an older gpt_ds's, or an
edited one) is refused wherever a checkpoint is read, unless the user allows it by name
(`ALLOW_FLAG`), and is then reported as unverified.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.manifest import Manifest

ALGORITHM = "sha256"
ALLOW_FLAG = "--allow_unverified"  # every command that reads a checkpoint has it
ALLOW_HELP = (
    "Load a checkpoint whose manifest records no checksums (an older gpt_ds's, or an edited "
    "gpt_ds.json): its bytes are not verified, and it is reported as unverified."
)
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
    """{name: hex digest}; one thread per file (reads and hashlib release the GIL)."""
    if not names:
        return {}
    with ThreadPoolExecutor(min(8, len(names))) as pool:
        digests = pool.map(lambda n: file_digest(Path(tag_dir) / n), names)
        return dict(zip(names, digests, strict=True))


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


class UnverifiedCheckpoint(CheckpointError):
    """A checkpoint whose bytes cannot be verified, refused without `ALLOW_FLAG`."""


def unverified_reason(manifest: Manifest) -> str | None:
    """Why the bytes of `manifest`'s checkpoint cannot be verified, or None when they can."""
    if manifest.checksum_algorithm is None or not manifest.checksums:
        return (
            "its manifest records no checksums (saved by a gpt_ds before checksums, or its "
            "gpt_ds.json was edited)"
        )
    if manifest.checksum_algorithm != ALGORITHM:
        return f"its checksums are {manifest.checksum_algorithm}, gpt_ds verifies {ALGORITHM}"
    unhashed = sorted(n for n in manifest.files if n not in manifest.checksums)
    if unhashed:
        more = f" and {len(unhashed) - 3} more" if len(unhashed) > 3 else ""
        return f"its manifest records no checksum for {', '.join(unhashed[:3])}{more}"
    return None


def check_verifiable(tag_dir: Path, manifest: Manifest, allow_unverified: bool) -> None:
    """An UnverifiedCheckpoint for a checkpoint that cannot be verified, unless allowed."""
    why = unverified_reason(manifest)
    if why is not None and not allow_unverified:
        raise UnverifiedCheckpoint(
            f"{tag_dir}: unverified checkpoint: {why}, so a damaged file would load unseen. "
            f"Load it anyway with {ALLOW_FLAG}, or verify the files another way first"
        )


def checksum_problems(tag_dir: Path, manifest: Manifest, names: list[str]) -> list[str]:
    """Files among `names` whose content is not what the manifest recorded (present files of
    the right size: `tags.file_problems` checks those first). Only files with a recorded
    checksum are hashed: `check_verifiable` refuses a manifest that lacks any."""
    names = [n for n in names if n in manifest.checksums]
    if manifest.checksum_algorithm != ALGORITHM:
        return []
    # checkpoint files are up to a few GB each: hashed one after another on one core, they
    # took longer than an export (digests_of hashes them side by side)
    return [
        f"{name} differs from its recorded {ALGORITHM} checksum"
        for name, got in digests_of(tag_dir, names).items()
        if got != manifest.checksums[name]
    ]
