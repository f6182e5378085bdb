"""A stop request from outside: SIGTERM/SIGINT (preemption, Ctrl-C, Slurm's warning signal).

The handler only records the signal; the training loop checks it once per step, agrees on it
across ranks, and stops after saving a checkpoint.
"""

from __future__ import annotations

import signal


class StopRequest:
    """Set by SIGTERM/SIGINT once installed; `signal_name` says which arrived (None: none)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None
