"""Check a run's checkpoints without loading them: tools/verify_checkpoint.py.

For each tag: the manifest, every listed file present at its recorded size, and its checksum.
Reads each file once and holds nothing in memory, so it can run beside a training job (on a
copied run directory, or before `--resume` / export on another machine).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.integrity import unverified_reason
from gpt_ds.checkpoint.manifest import MANIFEST, Manifest
from gpt_ds.checkpoint.tags import LATEST, complete_tags, damage, latest_tag, partial_dirs


@dataclass
class TagAudit:
    """What checking one tag found: its size, the time the check took, its damaged files."""

    tag: str
    iteration: int
    files: int
    bytes: int
    seconds: float
    problems: list[str] = field(default_factory=list)
    note: str = ""  # what it is, e.g. a universal tag and its source
    unverified: str | None = None  # why its bytes could not be checked (integrity.py)

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_tag(tag_dir: Path, manifest: Manifest) -> TagAudit:
    started = time.perf_counter()
    problems = damage(tag_dir, manifest)
    note = f"universal, from {manifest.source_tag}" if manifest.universal else ""
    return TagAudit(
        tag=tag_dir.name,
        iteration=manifest.iteration,
        files=len(manifest.files),
        bytes=sum(manifest.files.values()),
        seconds=time.perf_counter() - started,
        problems=problems,
        note=note,
        unverified=unverified_reason(manifest),
    )


def audit_run(path: Path, tag: str | None = None) -> tuple[Path, list[TagAudit]]:
    """(the run directory, one TagAudit per tag): for `tag`, for `path` when it is a tag
    directory, else for every complete tag, oldest first. A CheckpointError when there is
    nothing to check."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    if tag is None and (path / MANIFEST).is_file() and not (path / LATEST).is_file():
        path, tag = path.parent, path.name
    tags = [tag] if tag is not None else complete_tags(path)
    if not tags:
        raise CheckpointError(f"{path}: no complete checkpoint (looked for */{MANIFEST})")
    audits = []
    for t in tags:
        manifest = Manifest.read(path / t)
        if manifest is None:
            have = ", ".join(complete_tags(path)) or "none"
            raise CheckpointError(f"--tag {t}: no complete checkpoint in {path} (complete: {have})")
        audits.append(audit_tag(path / t, manifest))
    return path, audits


def audit_lines(out_dir: Path, audits: list[TagAudit]) -> list[str]:
    """A markdown-style table, the damaged files, and what else the directory holds."""
    latest = latest_tag(out_dir)
    lines = ["| tag | iteration | files | MiB | status |", "|---|---:|---:|---:|---|"]
    for a in audits:
        status = "DAMAGED" if not a.ok else "UNVERIFIED: sizes only" if a.unverified else "ok"
        status += f" ({a.note})" if a.note else ""
        mark = " (latest)" if a.tag == latest else ""
        mib = a.bytes / 2**20
        lines.append(f"| {a.tag}{mark} | {a.iteration} | {a.files} | {mib:.1f} | {status} |")
    for a in audits:
        lines += [f"{out_dir / a.tag}: {p}" for p in a.problems]
        lines += [f"{out_dir / a.tag}: unverified: {a.unverified}"] if a.unverified else []
    lines += [f"{d}: incomplete (its save did not finish), ignored" for d in partial_dirs(out_dir)]
    return lines
