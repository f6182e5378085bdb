"""`--profile`: torch.profiler over a few optimizer steps after warm-up.

Where a step's time goes (matmuls, the loss, casts, the optimizer, communication, host syncs)
is what decides what to make faster; the profiler answers it on the run the user is training.
The window opens WARMUP_STEPS steps after the launch's first step (compilation, allocator and
communicator warm-up fall before it) and covers PROFILE_STEPS steps, clipped to the run's end;
only the training steps are inside it, not evaluations or checkpoints. Every rank writes its
Chrome/Perfetto trace to OUT_DIR/profile/; rank 0 prints the operators by self time and what a
step asks of the device (kernel-launching operators and host syncs per phase, step_ops.py).
Inside the window every host sync is marked in the trace (host_syncs.py). On a GPU,
GPT_DS_SYNC_DEBUG=warn|error also turns on torch's own check over the window
(`torch.cuda.set_sync_debug_mode`): every synchronizing CUDA call warns, or raises with its
stack (the GPU tests run the sync-free step under "warn" and read the warnings).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpt_ds.base import dist, logs
from gpt_ds.observe.host_syncs import marking_syncs
from gpt_ds.observe.step_ops import count_step_ops, step_ops_table

WARMUP_STEPS = 2  # after the launch's first step
PROFILE_STEPS = 3
TOP_OPERATORS = 15
PROFILE_DIR = "profile"
SYNC_DEBUG_ENV = "GPT_DS_SYNC_DEBUG"


def sync_debug_mode() -> str:
    """GPT_DS_SYNC_DEBUG's mode for torch.cuda.set_sync_debug_mode (unset: "default", off)."""
    mode = os.environ.get(SYNC_DEBUG_ENV, "default")
    if mode not in ("default", "warn", "error"):
        raise ValueError(f"{SYNC_DEBUG_ENV}={mode!r}: use warn or error (or leave it unset)")
    return mode


@contextlib.contextmanager
def cuda_sync_check(mode: str) -> Iterator[None]:
    """torch's sync debug mode (`warn`, `error`) while open; `default` (off) again after."""
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def profile_window(first: int, last: int) -> tuple[int, int]:
    """(first, last) optimizer step profiled in a launch training steps `first`..`last`."""
    start = min(first + WARMUP_STEPS, last)
    return start, min(start + PROFILE_STEPS - 1, last)


class StepProfiler:
    """Profiles the training steps of `profile_window`; `step(it)` wraps each step."""

    def __init__(self, out_dir: str | Path, first: int, last: int, enabled: bool):
        self.enabled = enabled
        self.start, self.end = profile_window(first, last)
        self.out = Path(out_dir) / PROFILE_DIR
        self.cuda = torch.cuda.is_available()
        self.active: profile | None = None
        self.marks = contextlib.ExitStack()  # the host syncs marked while the window is open
        self.last_step = self.start
        self.sync_mode = sync_debug_mode()

    @contextlib.contextmanager
    def step(self, it: int) -> Iterator[None]:
        """Open the window before step `start`, close it (trace, table) after step `end`."""
        if self.enabled and it == self.start:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.active = profile(activities=activities)
            self.active.start()
            self.marks.enter_context(marking_syncs())
            if self.cuda and self.sync_mode != "default":
                window = f"steps {self.start}-{self.end}"
                dist.print0(f"{SYNC_DEBUG_ENV}={self.sync_mode}: torch's sync check over {window}")
                self.marks.enter_context(cuda_sync_check(self.sync_mode))
        yield
        if self.active is not None:
            self.last_step = it
            if it == self.end:
                self.close()

    def close(self) -> None:
        """Stop the profiler if it runs (also when the run ends inside the window) and write
        what it holds: this rank's trace, and rank 0's table of the top operators."""
        if self.active is None:
            return
        prof, self.active = self.active, None
        self.marks.close()
        if self.cuda:
            torch.cuda.synchronize()
        prof.stop()
        self.out.mkdir(parents=True, exist_ok=True)
        trace = self.out / f"rank{dist.rank()}.steps{self.start}-{self.last_step}.json"
        prof.export_chrome_trace(str(trace))
        sort = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=TOP_OPERATORS)
        dist.print0(
            f"profile of steps {self.start}-{self.last_step} (rank 0; every rank's trace in "
            f"{self.out}/, open it in https://ui.perfetto.dev):\n{table}"
        )
        if dist.is_main():
            ops = count_step_ops(trace, self.last_step - self.start + 1)
            logs.LOGGER.info(f"per optimizer step (rank 0):\n{step_ops_table(ops)}")
