"""A process's memory figures from /proc (the same measure for gpt_ds and for its peers), and
a `deepspeed` launch watched to its end for its ranks' peak resident set."""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpt_ds.base import processes
from support.launch import REPO, deepspeed_launch, free_port, launch_env, remove_shm_buffers


def status_bytes(pid: int, field: str) -> int:
    """A memory field of /proc/PID/status (VmHWM: peak resident set; RssAnon: anonymous
    memory), in bytes; 0 once the process is gone (gpt_ds's reading of /proc)."""
    return processes.status_bytes(pid, field) or 0


def rank_pids(launcher: psutil.Process) -> list[psutil.Process]:
    """The launch's rank processes (the deepspeed launcher starts them with --local_rank)."""
    try:
        children = launcher.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [
        c
        for c in children
        if any(part.startswith("--local_rank") for part in _cmdline(c))
        and "deepspeed.launcher.launch" not in " ".join(_cmdline(c))
    ]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


@dataclass
class Watched:
    """A launch `run_watched` saw end."""

    cmd: list[str]
    rc: int  # 124: stopped at its deadline
    peak_bytes: int  # the largest rank's VmHWM (0 if no rank was seen)


def run_watched(
    ranks: int,
    args: list[str],
    log: Path,
    timeout: float = math.inf,
    extra_env: dict[str, str] | None = None,
) -> Watched:
    """`deepspeed --num_gpus RANKS ARGS` on a fresh port, output to `log`, every rank's VmHWM
    polled every 0.1 s: the kernel keeps each rank's peak, but only while the rank lives. Past
    `timeout` seconds the launch and every process it started are killed. Its /dev/shm buffers
    are removed either way. The command a user runs, under the test suite too (the benchmarks'
    smoke tests): its ranks are fresh processes, measured as a user's are."""
    port = free_port()
    cmd = deepspeed_launch(ranks, port, args[0], [str(a) for a in args[1:]], [])
    env = dict(launch_env(), **(extra_env or {}))  # the launcher passes it to its ranks
    deadline = time.monotonic() + timeout
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        launcher = psutil.Process(proc.pid)
        peaks = processes.PeakSampler("VmHWM", lambda: [p.pid for p in rank_pids(launcher)])
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                peaks.sample()
                time.sleep(0.1)
        finally:
            stopped = proc.poll() is None
            if stopped:
                for p in [*launcher.children(recursive=True), launcher]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
                proc.wait()
            remove_shm_buffers("127.0.0.1", port)
    return Watched(cmd, 124 if stopped else proc.returncode, peaks.peak_bytes or 0)
