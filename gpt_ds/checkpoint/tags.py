"""Which tags of a run directory are checkpoints, and which one a request means.

One answer for training (`--resume`), export, sampling and the universal tool: a tag is
complete iff it has a manifest and is not a `*.partial` staging directory; a requested tag is
checked against the manifest's file list (present, at its recorded size) before anything loads.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.errors import CheckpointError, GptDsError
from gpt_ds.checkpoint.integrity import UnverifiedCheckpoint, check_verifiable, checksum_problems
from gpt_ds.checkpoint.manifest import MANIFEST, Manifest, atomic_write_text

LATEST = "latest"
PARTIAL = ".partial"
BEST = "best"  # a tag request meaning the run's best checkpoint (Manifest.best_tag)
ITER_TAG = re.compile(r"^iter_(\d+)$")


@dataclass(frozen=True)
class CheckpointRef:
    """One complete, checked checkpoint tag of a training run."""

    out_dir: Path
    tag: str
    manifest: Manifest

    @property
    def tag_dir(self) -> Path:
        return self.out_dir / self.tag


def complete_tags(out_dir: Path) -> list[str]:
    """Tags of `out_dir` with a manifest (staging `*.partial` directories skipped), oldest
    first by iteration."""
    out_dir = Path(out_dir)
    found = [
        (m.iteration, d.name)
        for d in (out_dir.iterdir() if out_dir.is_dir() else [])
        if d.is_dir() and not d.name.endswith(PARTIAL) and (m := Manifest.read(d))
    ]
    return [name for _, name in sorted(found)]


def partial_dirs(out_dir: Path) -> list[Path]:
    """Leftovers of interrupted saves: any `TAG.partial/` (possibly still empty), and tag
    directories holding DeepSpeed files but no manifest."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted(
        d
        for d in out_dir.iterdir()
        if d.is_dir()
        and (
            d.name.endswith(PARTIAL) or (not (d / MANIFEST).exists() and any(d.glob("*_states.pt")))
        )
    )


def latest_tag(out_dir: str | Path) -> str | None:
    """The tag the `latest` file names (None when there is no such file)."""
    try:
        return (Path(out_dir) / LATEST).read_text().strip() or None
    except OSError:
        return None


def write_latest(out_dir: Path, tag: str) -> None:
    atomic_write_text(Path(out_dir) / LATEST, tag)


def check_writable(out_dir: Path) -> None:
    """Fail before training, not at the first checkpoint, when out_dir cannot be written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write_probe_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise GptDsError(f"--out_dir {out_dir}: not writable ({exc.strerror or exc})") from exc


def is_checkpoint_dir(path: Path) -> bool:
    """True for a training out dir (has `latest` or a complete tag) or a tag directory."""
    path = Path(path)
    return (path / MANIFEST).is_file() or (path / LATEST).is_file() or bool(complete_tags(path))


def file_problems(tag_dir: Path, manifest: Manifest) -> list[str]:
    """Files the manifest lists that are missing or not at their recorded size."""
    problems = []
    for name, size in manifest.files.items():
        f = tag_dir / name
        if not f.is_file():
            problems.append(f"{name} missing")
        elif f.stat().st_size != size:
            problems.append(f"{name} has {f.stat().st_size} bytes, manifest says {size}")
    return problems


def damage(tag_dir: Path, manifest: Manifest) -> list[str]:
    """What is wrong with a tag's files: missing or resized ones, else (every file there at its
    size) those whose content differs from the recorded checksum. Empty: intact."""
    return file_problems(tag_dir, manifest) or checksum_problems(
        tag_dir, manifest, list(manifest.files)
    )


def _listing(out_dir: Path) -> str:
    have = complete_tags(out_dir)
    return f"complete tags: {', '.join(have)}" if have else "no complete tags"


def _damaged(out_dir: Path, tag_dir: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"{tag_dir}: damaged checkpoint: {what}. Use another tag ({_listing(out_dir)}) or "
        "restore the file from a copy"
    )


def _check_tag(
    out_dir: Path,
    tag: str,
    flag: str,
    verify: bool = False,
    damaged: Mapping[str, str] | None = None,
    allow_unverified: bool = False,
) -> CheckpointRef:
    """`tag` as a CheckpointRef, or a CheckpointError saying why it is not loadable: no
    manifest, no checksums to verify it by (unless `allow_unverified`), a listed file missing
    or of another size, or (`verify`) another checksum, or found damaged before (`damaged`:
    tag -> what is wrong)."""
    tag_dir = out_dir / tag
    if damaged and tag in damaged:
        raise _damaged(out_dir, tag_dir, damaged[tag])
    if not tag_dir.is_dir() or tag.endswith(PARTIAL):
        raise CheckpointError(
            f"{flag} {tag}: no complete checkpoint with that tag in {out_dir} ({_listing(out_dir)})"
        )
    manifest = Manifest.read(tag_dir)
    if manifest is None:
        raise CheckpointError(
            f"{tag_dir}: incomplete checkpoint (no {MANIFEST}: its save did not finish); "
            f"use another tag ({_listing(out_dir)})"
        )
    check_verifiable(tag_dir, manifest, allow_unverified)
    problems = file_problems(tag_dir, manifest)
    if problems:
        raise CheckpointError(
            f"{tag_dir}: incomplete checkpoint ({'; '.join(problems)}); ({_listing(out_dir)})"
        )
    problems = checksum_problems(tag_dir, manifest, list(manifest.files)) if verify else []
    if problems:
        raise _damaged(out_dir, tag_dir, "; ".join(problems))
    return CheckpointRef(out_dir=out_dir, tag=tag, manifest=manifest)


def _best_tag(out_dir: Path, flag: str) -> str:
    """The tag `best` stands for: the best checkpoint the newest complete one records."""
    tags = complete_tags(out_dir)
    manifest = Manifest.read(out_dir / tags[-1]) if tags else None
    if manifest is None or not manifest.best_tag:
        raise CheckpointError(
            f"{flag} {BEST}: {out_dir} records no best checkpoint (none saved at an evaluation "
            f"that improved the val loss); name a tag ({_listing(out_dir)})"
        )
    return manifest.best_tag


def _split_tag_dir(path: Path, tag: str | None) -> tuple[Path, str | None]:
    """(out dir, tag) for a path that may be a tag directory itself."""
    if (path / MANIFEST).is_file() and not (path / LATEST).is_file():
        if tag is not None and tag != path.name:
            raise CheckpointError(f"{path} is the checkpoint of tag {path.name!r}, not {tag!r}")
        return path.parent, path.name
    return path, tag


def resolve(
    path: str | Path,
    tag: str | None = None,
    *,
    flag: str = "--tag",
    fall_back: bool = False,
    verify: bool = False,
    damaged: Mapping[str, str] | None = None,
    note: Callable[[str], None] = print,
    allow_unverified: bool = False,
) -> CheckpointRef:
    """The checkpoint a user asked for: `tag` in the run directory `path` (or `path` is a tag
    directory), or with no tag the one `latest` names. Reads no weights, but with `verify`
    every file once for its checksum; `damaged` names tags already found damaged. A tag with
    no checksums to verify is refused (integrity.UnverifiedCheckpoint) unless
    `allow_unverified`, and never passed over for an older one.

    With `fall_back`, a `latest` that is missing or names a tag that is not loadable gives the
    newest loadable tag instead, said through `note`; a named tag never falls back. `flag` is
    the option the user names a tag with, for the messages.
    """
    path = Path(path)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise CheckpointError(f"checkpoint directory {path} {what}")
    out_dir, tag = _split_tag_dir(path, tag)
    if tag == BEST and not (out_dir / BEST).is_dir():
        tag = _best_tag(out_dir, flag)
    check = functools.partial(
        _check_tag,
        out_dir,
        flag=flag,
        verify=verify,
        damaged=damaged,
        allow_unverified=allow_unverified,
    )
    if tag is not None:
        return check(tag)
    named = latest_tag(out_dir)
    if not fall_back:
        if named is None:
            raise CheckpointError(
                f"{out_dir}: no `{LATEST}` file names a checkpoint; give {flag} "
                f"({_listing(out_dir)})"
            )
        return check(named)
    return _newest_loadable(out_dir, named, flag, check, note)


def _newest_loadable(
    out_dir: Path,
    named: str | None,
    flag: str,
    check: Callable[[str], CheckpointRef],
    note: Callable[[str], None],
) -> CheckpointRef:
    if named is not None:
        try:
            return check(named)
        except UnverifiedCheckpoint:
            raise  # the user decides: an older tag would hide it
        except CheckpointError as exc:
            reason = str(exc)
    else:
        reason = f"there is no `{LATEST}` file"
    for tag in reversed(complete_tags(out_dir)):
        try:
            ref = check(tag)
        except UnverifiedCheckpoint:
            raise
        except CheckpointError:
            continue
        note(f"checkpoint: {reason}; using the newest complete tag {tag!r}")
        return ref
    raise CheckpointError(f"{flag}: no complete checkpoint in {out_dir} (looked for */{MANIFEST})")
