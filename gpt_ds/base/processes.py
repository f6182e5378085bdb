"""Processes on this machine as the kernel shows them: whether one is still there and who it is
(a lock's owner, the launcher of this rank, the writer of a leftover file), and the memory one
holds, its resident set (RSS): read from /proc, its peak sampled (`PeakSampler`, the package's
one sampler: the export's anonymous memory, the benchmarks' ranks), and glibc's freed blocks
given back to the kernel (`--release_host_memory`); and the stop asked of this one from
outside (`StopRequest`: a signal, or the launch that started it gone).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

# Is a process still there? For leftovers named after the process that made them (a
# `.train.bin.PID.tmp` of a killed prepare_data, an export's `.OUT.tmp-PID`, an out dir's lock):
# only a dead process's leftovers may be removed, never those of a run still writing.


def pid_alive(pid: str | int) -> bool:
    """False only when no process `pid` exists on this machine; True when unsure."""
    try:
        os.kill(int(pid), 0)
    except ValueError:
        return True  # not a pid: not our naming, leave it alone
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of `/proc/PID/stat` (index 0 is field 3, the state), None when the
    process is gone. Field 2, the command, may hold spaces: split after its closing ')'."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat.rsplit(")", 1)[1].split()


def process_identity(pid: int) -> str | None:
    """`BOOT_ID:START_TICKS` of a live process of this machine, None when there is no such
    process. A pid reused by another process, or a reboot, gives another identity."""
    fields = _stat_fields(pid)
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return None if fields is None else f"{boot_id}:{fields[19]}"  # field 22: start time


def parent_pid(pid: int) -> int | None:
    """The parent of a live process of this machine (None when it is gone)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])  # field 4: ppid


def command_line(pid: int) -> str:
    """A live process's command line, arguments joined by spaces ('' when it is gone)."""
    try:
        raw = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


# The memory a process holds. /proc/PID/status has the figures the kernel keeps: VmHWM, the peak
# resident set (gone with the process), and RssAnon, anonymous memory (its current value only;
# RSS also counts memory-mapped files, page cache the kernel may drop at will). A peak the
# kernel does not keep, or keeps only while the process lives, is sampled.


def status_bytes(pid: int | str, field: str) -> int | None:
    """A memory field of `/proc/PID/status` (`VmHWM`, `RssAnon`...) in bytes; `pid` "self" for
    this process. None when the process is gone or the field is not there (not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next((x for x in f if x.startswith(f"{field}:")), None)
    except OSError:
        return None
    return None if line is None else int(line.split()[1]) * 1024


def peak_rss_gib() -> float:
    """This process's peak resident set size so far, in GiB (Linux reports KiB, macOS bytes):
    the one peak-RSS reading of the package (training metrics, the export's summary)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 * (1 if sys.platform == "darwin" else 1024)


class PeakSampler:
    """The peak of one `/proc/PID/status` field over a stretch of work: polled every
    `interval_s` on a thread (`with PeakSampler(...)`), or by the caller's own loop (`sample`).

    `pids` names the processes to read at each poll (this process when None); a process that
    is not there (yet, or any more) is skipped. `peak_bytes`: the largest value any of them
    reached, None when none could be read.
    """

    def __init__(
        self,
        field: str,
        pids: Callable[[], Iterable[int | str]] | None = None,
        interval_s: float = 0.01,
    ) -> None:
        self.field = field
        self.pids = pids or (lambda: ("self",))
        self.interval_s = interval_s
        self.peaks: dict[int | str, int] = {}  # each process's largest value
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def peak_bytes(self) -> int | None:
        return max(self.peaks.values(), default=None)

    def sample(self) -> None:
        """Read the field of each process once, keeping each one's largest value."""
        for pid in self.pids():
            value = status_bytes(pid, self.field)
            if value is not None:
                self.peaks[pid] = max(self.peaks.get(pid, 0), value)

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> PeakSampler:
        if Path("/proc/self/status").is_file():  # no /proc (not Linux): nothing to poll
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()


# A rank's resident memory against glibc's habit of keeping what a step freed.
#
# Measured on CPU ranks: a ZeRO-3 step of gpt2-medium on 4
# ranks peaked at 5.0-5.5 GiB RSS per rank against 3.3 GiB of live tensors. The difference is
# glibc's heap: blocks a step frees (gathered parameters, reduction buckets) are kept for reuse,
# and the next allocations of other sizes grow the heap instead. A fixed mmap threshold makes
# every block from 1 MiB up its own mapping, handed back to the kernel when freed: the same run
# then peaks at 3.3 GiB at the same step time. On small models, whose steps allocate and free
# multi-MiB activations many times a second, the page faults cost 10-35% of the speed, so `auto`
# releases only for models of 100M parameters and more on CPU ranks, where the host memory is
# the training memory and the saving is gigabytes.

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
RELEASE_THRESHOLD = 1 << 20  # blocks from 1 MiB up: mapped, and unmapped when freed
AUTO_MIN_PARAMS = 100_000_000
RELEASE_CHOICES = ("auto", "on", "off")


def wants_release(choice: str, device_type: str, num_params: int) -> bool:
    """Whether to release freed blocks: `on`/`off` as asked; `auto` on CPU for large models."""
    if choice != "auto":
        return choice == "on"
    return device_type == "cpu" and num_params >= AUTO_MIN_PARAMS


def release_freed_blocks() -> str:
    """Set glibc's mmap threshold (fixed: no more dynamic raising); a line for the log."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, RELEASE_THRESHOLD) == 1
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        ok = False
    if not ok:
        return "host memory: this C library has no mallopt; freed blocks stay with the process"
    return (
        "host memory: blocks of 1 MiB and more go back to the kernel when freed "
        "(--release_host_memory)"
    )


# A stop request from outside: SIGTERM/SIGINT (preemption, Ctrl-C, Slurm's warning signal), or
# the launch that started this rank going away.
#
# The handler only records the request; the training loop checks it once per step, agrees on it
# across ranks, and stops after saving a checkpoint.
#
# Why the watch: on one node, SIGTERM to the `deepspeed` command (the pid a user or a job script
# knows) kills DeepSpeed's runner at once without telling its launcher, and the ranks would train
# on, orphaned, to the end with no save. So a rank started by `deepspeed.launcher.launch` checks
# every second that its launcher is alive and that the launcher's parent (the runner, or the
# shell pdsh/ssh opened for it on another node) still is; when either is gone, it stops as for
# SIGTERM. A launcher started by hand from a shell is not tied to that shell.

WATCH_SECONDS = 1.0


class StopRequest:
    """Set by SIGTERM/SIGINT once installed, or by the launch watch; `reason` says why (None:
    no request)."""

    def __init__(self, watch_launch: bool = True) -> None:
        self.reason: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None
        watched = launch_processes() if watch_launch else None
        if watched is not None:
            self._watcher = threading.Thread(
                target=self._watch, args=watched, name="gpt_ds-launch-watch", daemon=True
            )
            self._watcher.start()

    def close(self) -> None:
        """End the watch before the interpreter exits: a daemon thread woken during
        finalisation is torn down by pthread_exit, which can abort the process."""
        self._closed.set()
        if self._watcher is not None:
            self._watcher.join()

    def _handle(self, signum, _frame) -> None:
        self.reason = f"received {signal.Signals(signum).name}"

    def _watch(self, launcher: int, starter: int | None) -> None:
        while not self._closed.wait(WATCH_SECONDS):
            if os.getppid() != launcher:
                self.reason = f"DeepSpeed's launcher (pid {launcher}) is gone"
            elif starter is not None and parent_pid(launcher) != starter:
                self.reason = f"the process that started the launch (pid {starter}) is gone"
            if self.reason is not None:
                return

    @property
    def requested(self) -> bool:
        return self.reason is not None


def launch_processes() -> tuple[int, int | None] | None:
    """(launcher pid, pid of the DeepSpeed process that started it or None) when this rank is
    a child of `deepspeed.launcher.launch`; None otherwise (python train.py, torchrun, srun)."""
    launcher = os.getppid()
    if "deepspeed.launcher.launch" not in command_line(launcher):
        return None
    starter = parent_pid(launcher)
    # the runner (`.../bin/deepspeed ...`) or pdsh's `bash -c "... deepspeed.launcher.launch"`
    tied = starter is not None and starter > 1 and "deepspeed" in command_line(starter)
    return launcher, starter if tied else None
