"""What the two workers of `pytest -n 2` share: what the suite makes once per session and its
tests only read (prepared data, trained runs: the first worker to ask makes it under a lock,
the other waits and reads it), the machine (a test marked `alone` runs while the other worker
waits), and the tests: whole modules to a worker."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers.system import file_lock


def both_workers(basetemp: Path) -> Path:
    """The folder every worker sees: under xdist the one above a worker's base temp folder
    (pytest-N/, holding popen-gw0/ and popen-gw1/), else the session's base temp folder."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """`name` in the folder both workers see, made."""
    folder = both_workers(tmp_path_factory.getbasetemp()) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def made_once(path: Path, make: Callable[[Path], str]) -> str:
    """`make(path)` the first time any worker asks for `path` this session; what it returned
    (a run's stdout, say), read back from beside `path` every time."""
    said = path.with_name(path.name + ".said")
    with file_lock(path.with_name(path.name + ".lock")):
        if not said.exists():  # a make that raised left none: the next caller tries again
            text = make(path)
            said.write_text(text)
        return said.read_text()


@contextlib.contextmanager
def machine_turn(lock_stem: Path, alone: bool) -> Iterator[None]:
    """Hold the machine for one test: shared with the other worker, or `alone` (timings,
    machine-wide state). The gate keeps a waiting `alone` from being overtaken: a test takes
    the gate, then its hold, then lets the gate go; `alone` keeps the gate until it holds."""
    with open(f"{lock_stem}.gate", "w") as gate, open(f"{lock_stem}.hold", "w") as hold:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(hold, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield


# Test modules whose tests use the loopback sshd (helpers/sshd.py): its ~/.ssh/config block maps
# 127.0.0.1-3 to one sshd's port, so one worker runs them all.
SSH_MODULES = {"test_two_node.py", "test_preflight.py", "test_openmpi.py"}
# The longest modules after them, longest first (each 150-700 s of one worker in a full run on
# 2 cores, 2026-11-29): xdist hands whole modules out in collection order, so that the short
# ones fill both workers' ends instead of one worker ending alone on a long one.
LONGEST_MODULES = (
    "test_faults.py", "test_wheelhouse.py", "test_benchmarks.py", "test_runtime_deps.py",
    "test_launchers.py", "test_chunked_loss.py", "test_fault_drill.py", "test_startup_memory.py",
    "test_plot.py", "test_lm_eval.py",
)  # fmt: skip


def run_order(module: str) -> tuple[bool, int]:
    """A module's place in the run: the sshd modules, then the longest, then the rest."""
    longest = LONGEST_MODULES.index(module) if module in LONGEST_MODULES else len(LONGEST_MODULES)
    return module not in SSH_MODULES, longest


def worker_unit(nodeid: str) -> str:
    """What one worker runs whole: the test's module, or "sshd" for the sshd modules."""
    module = nodeid.split("::", 1)[0]
    return "sshd" if Path(module).name in SSH_MODULES else module


def module_scheduling(config: pytest.Config, log):
    """xdist's scheduler by scope, each scope a `worker_unit`, handed out in collection order
    (`run_order`): xdist's own reorder by test count (`--loadscope-reorder`, on by default and
    not told apart from an explicit flag) would put one-test modules of minutes last."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

    return ModuleScheduling(config, log)
