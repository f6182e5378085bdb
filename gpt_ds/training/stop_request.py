"""A stop asked for from outside the run: SIGTERM/SIGINT, or the launch that started this rank
going away (`StopRequest`); the trainer checks it once per step and stops after a save."""

from __future__ import annotations

import os
import signal
import threading

from gpt_ds.base.processes import command_line, parent_pid

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
