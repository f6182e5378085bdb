"""Changes to this machine that some tests need: Debian packages (apt-get), a block in
`~/.ssh/config` (the loopback sshd), mounts (a size-limited tmpfs, a read-only bind mount).

Made only when GPT_DS_TEST_SYSTEM=1: `.ci/run` sets it, so CI runs every test; a user's plain
`pytest` on a workstation or a shared node changes nothing outside the checkout and temp dirs,
and those tests skip, naming the variable. Every such change in the tests goes through here
(tests/test_system_changes.py holds it)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

OPT_IN = "GPT_DS_TEST_SYSTEM"


class Unavailable(Exception):
    """This machine cannot, or may not, do what a test needs; the message says why."""


def allowed() -> bool:
    return os.environ.get(OPT_IN) == "1"


def not_allowed(what: str) -> str:
    """Why a test that needs `what` skips without the opt-in."""
    return f"{what} would change this machine: set {OPT_IN}=1 to allow it (.ci/run does)"


def check_allowed(what: str) -> None:
    if not allowed():
        raise Unavailable(not_allowed(what))


def ensure_packages(packages: dict[str, str]) -> None:
    """apt-get install the Debian package of each missing tool (tool -> package), with the
    opt-in; Unavailable when one is missing and cannot or may not be installed."""
    with machine_lock("apt"):  # the other worker of `pytest -n 2` may be installing too
        _install_missing(packages)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held by one process at a time: an exclusive flock on `path`, made if missing."""
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def machine_lock(name: str) -> contextlib.AbstractContextManager[None]:
    """Held by one process of this machine at a time (any test session, any worker): for
    what is machine-wide, the packages and ~/.ssh/config."""
    return file_lock(Path(tempfile.gettempdir()) / f"gpt_ds_tests_{name}.lock")


def _install_missing(packages: dict[str, str]) -> None:
    missing = sorted({pkg for tool, pkg in packages.items() if not have(tool)})
    if not missing:
        return
    check_allowed(f"apt-get install {' '.join(missing)}")
    if os.geteuid() != 0:
        raise Unavailable(f"{', '.join(missing)} missing and not root: cannot apt-get install")
    if not shutil.which("apt-get"):
        raise Unavailable(f"{', '.join(missing)} missing and no apt-get on this machine")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:  # stale or empty package lists: update once and retry
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
        proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise Unavailable(f"apt-get install {' '.join(missing)} failed: {proc.stderr[-500:]}")


def have(tool: str) -> bool:
    return Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None


def mount(*args: str) -> str | None:
    """mount(8) ARGS, with the opt-in; the reason it did not happen, or None."""
    if not allowed():
        return not_allowed(f"mount {' '.join(args)}")
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def umount(target: Path) -> None:
    subprocess.run(["umount", str(target)], check=False)
