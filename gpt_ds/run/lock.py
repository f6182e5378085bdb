"""The out dir of a run: one run at a time in it (`OUT_DIR/gpt_ds.lock`, taken by rank 0 before
any rank writes), and what an earlier run left there, which a launch without `--resume` never
replaces (`check_fresh_start`; `--resume auto` continues it or starts).

Two runs into one directory (a re-submitted job, a Slurm array with one out dir) would
overwrite each other's checkpoints and interleave their logs while both report success. The
lock file is created with O_EXCL (atomic on local file systems and NFSv3+, so on the shared
file system a multi-node run needs anyway) and names its owner: run id, host, pid and the
process's start identity. A lock is stale, and is replaced with a message, when its owner is
gone: on this host its pid no longer runs (or is another process: start time and boot id
differ); from another host, when its heartbeat (the file's mtime, refreshed every minute by the
owner) is older than 10 minutes by the file system's own clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gpt_ds.base import logs
from gpt_ds.base.errors import GptDsError
from gpt_ds.base.processes import process_identity
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.tags import LATEST, complete_tags, latest_tag, partial_dirs
from gpt_ds.observe.metrics_file import METRICS_FILE, attempt_file, json_records

# What an earlier run left in the out dir, and what a launch may do with it.
#
# A launch without `--resume` into a directory holding gpt_ds output (a tag directory, complete
# or not, `latest`, `metrics.jsonl`) would replace that run's checkpoints and mix its metrics
# with its own: it is refused before any work, naming what is there and the ways on.
# `--resume auto` is the setting for a job a scheduler may start again: it continues the newest
# complete checkpoint when there is one, and otherwise starts the run, also over what a launch
# killed before its first checkpoint left (its metrics set aside, no file removed): a requeued
# job always makes progress. Plain `--resume` refuses an out dir without a checkpoint.

AUTO = "auto"  # --resume auto: continue if there is a checkpoint, else start


class OutDirHasRun(GptDsError):
    """The out dir holds an earlier run's output that this launch would replace or mix into."""


def earlier_output(out_dir: Path) -> list[str]:
    """What gpt_ds output `out_dir` holds, one phrase each, newest checkpoint first; empty for
    a directory a run may start in."""
    found = [
        f"{tag}/ (iteration {iteration_of(out_dir / tag)})"
        for tag in reversed(complete_tags(out_dir))
    ]
    found += [f"{d.name}/ (an interrupted save, no manifest)" for d in partial_dirs(out_dir)]
    if (out_dir / LATEST).is_file():
        found.append(f"`{LATEST}` (naming {latest_tag(out_dir) or 'nothing'})")
    if (out_dir / METRICS_FILE).is_file():
        last = last_logged_iteration(out_dir / METRICS_FILE)
        found.append(f"{METRICS_FILE} ({'up to iteration ' + str(last) if last else 'no steps'})")
    return found


def iteration_of(tag_dir: Path) -> int | str:
    manifest = Manifest.read(tag_dir)
    return manifest.iteration if manifest else "?"


def last_logged_iteration(path: Path) -> int | None:
    """The highest `iter` of a metrics file's records (torn or foreign lines skipped)."""
    iters = [it for r in json_records(path) if isinstance(it := r.get("iter"), int)]
    return max(iters, default=None)


def check_fresh_start(out_dir: Path) -> None:
    """A run without --resume may start in `out_dir` only when it holds no gpt_ds output."""
    found = earlier_output(out_dir)
    if not found:
        return
    refuse_if_busy(out_dir)
    continue_it = (
        f"continue it with --resume (the newest complete checkpoint) or --resume {AUTO}"
        if complete_tags(out_dir)
        else "it has no complete checkpoint to continue"
    )
    raise OutDirHasRun(
        f"--out_dir {out_dir} already holds a run: {', '.join(found)}. A new run there would "
        f"replace its checkpoints and mix its metrics. Ways on: {continue_it}; or start the "
        f"new run in another --out_dir (or delete {out_dir} first)."
    )


def auto_starts(out_dir: Path) -> bool:
    """`--resume auto`: True when the run starts (no complete checkpoint in `out_dir`), False
    when it continues the newest one. Output without a checkpoint (a launch killed before its
    first save) does not stop a start; a live run's does (OutDirBusy)."""
    if complete_tags(out_dir):
        return False
    if earlier_output(out_dir):
        refuse_if_busy(out_dir)
    return True


def start_over_line(out_dir: Path) -> str:
    """What `--resume auto` says when it starts: afresh over a killed attempt's leftovers
    (naming them and where its metrics go), or in an out dir without gpt_ds output."""
    found = earlier_output(out_dir)
    if not found:
        return f"--resume {AUTO}: no checkpoint in {out_dir}: starting the run"
    aside = attempt_file(out_dir)
    kept = f"its metrics move to {aside.name}" if aside else "it logged nothing"
    return (
        f"--resume {AUTO}: no complete checkpoint in {out_dir}, only what a launch killed before "
        f"its first save left ({', '.join(found)}): starting the run afresh; {kept}, no "
        "file is removed"
    )


def refuse_if_busy(out_dir: Path) -> None:
    """A live run's output is that run's business: say who holds the out dir (lock.py)."""
    path = out_dir / LOCK_NAME
    owner = LockOwner.read(path)
    if owner is not None and stale_reason(owner, path) is None:
        raise OutDirBusy(busy_message(out_dir, owner))


LOCK_NAME = "gpt_ds.lock"
HEARTBEAT_SECONDS = 60.0
STALE_AFTER_SECONDS = 600.0


class OutDirBusy(GptDsError):
    """Another live run owns the out dir."""


def new_run_id() -> str:
    """Sortable and unique enough to tell launches apart: `20261123-224501-3fa9c2`."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass(kw_only=True)
class LockOwner:
    run_id: str
    host: str
    pid: int
    identity: str | None  # processes.process_identity of pid, on `host`
    started_at: str
    command: str

    @classmethod
    def this_process(cls, run_id: str) -> LockOwner:
        return cls(
            run_id=run_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            identity=process_identity(os.getpid()),
            started_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            command=" ".join(sys.argv)[:500],
        )

    @classmethod
    def read(cls, path: Path) -> LockOwner | None:
        """The owner a lock file names; None when it cannot be read (being written, removed,
        or not ours)."""
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def describe(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on host {self.host}, started {self.started_at})"


def fs_now(directory: Path) -> float:
    """The current time by the clock that stamps files in `directory` (an NFS server's, say),
    so that the age of another host's heartbeat does not depend on clock skew."""
    probe = directory / f".{LOCK_NAME}.clock.{os.getpid()}"
    probe.touch()
    try:
        return probe.stat().st_mtime
    finally:
        probe.unlink(missing_ok=True)


def stale_reason(owner: LockOwner, path: Path) -> str | None:
    """Why the lock `owner` holds is stale, or None while its run may be alive."""
    if owner.host == socket.gethostname():
        now = process_identity(owner.pid)
        if now is None:
            return f"pid {owner.pid} is not running"
        if owner.identity is not None and now != owner.identity:
            return f"pid {owner.pid} is now another process"
        return None
    age = fs_now(path.parent) - path.stat().st_mtime
    if age > STALE_AFTER_SECONDS:
        return f"no heartbeat from host {owner.host} for {age / 60:.0f} minutes"
    return None


class RunLock:
    """The lock of one out dir, held by this process until `release()`."""

    def __init__(self, path: Path, owner: LockOwner):
        self.path, self.owner = path, owner
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="gpt_ds-lock", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):  # unreachable for now: the next beat tries again
                os.utime(self.path)

    def release(self) -> None:
        """Remove the lock file, if it is still ours."""
        self._stop.set()
        self._beat.join()  # not left to interpreter shutdown (see processes.StopRequest.close)
        holder = LockOwner.read(self.path)
        if holder is None or holder.run_id != self.owner.run_id:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:  # never mask the run's own outcome: the next run finds it stale
            logs.whole_line(
                f"warning: could not remove the lock {self.path} ({exc.strerror or exc}); "
                "the next run will find it stale and replace it",
                sys.stderr,
            )


def busy_message(out_dir: Path, owner: LockOwner) -> str:
    return (
        f"--out_dir {out_dir} is in use by {owner.describe()}; two runs in one directory would "
        f"overwrite each other's checkpoints. Wait for it to finish, stop it (kill -TERM "
        f"{owner.pid} on {owner.host}: it saves and exits), or use another --out_dir. If that run "
        f"is gone and its host cannot tell (another machine), delete {out_dir / LOCK_NAME}"
    )


def acquire(out_dir: Path, run_id: str, note: Callable[[str], None] = print) -> RunLock:
    """Take `out_dir`'s lock for this process; OutDirBusy when a live run holds it. A stale
    lock is replaced, said through `note`."""
    path = Path(out_dir) / LOCK_NAME
    me = LockOwner.this_process(run_id)
    for _ in range(50):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = LockOwner.read(path)
            if other is None:  # being written or removed right now: look again
                time.sleep(0.1)
                continue
            reason = stale_reason(other, path)
            if reason is None:
                raise OutDirBusy(busy_message(Path(out_dir), other)) from None
            note(f"out dir: removing the stale lock of {other.describe()}: {reason}")
            if LockOwner.read(path) == other:  # not replaced meanwhile by another new run
                path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(me), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        return RunLock(path, me)
    raise OutDirBusy(
        f"{path} exists but cannot be read as a gpt_ds lock; if no run uses {out_dir}, delete it"
    )
