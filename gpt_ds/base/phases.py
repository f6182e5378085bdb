"""The phases of a training step (forward, loss, backward, the engine's step) as profiler
ranges, so a `--profile` trace can be counted phase by phase (`observe/step_ops.py`)."""

from __future__ import annotations

from torch.autograd.profiler import record_function

PHASE_PREFIX = "gpt_ds.phase::"


def phase(name: str) -> record_function:
    """A profiler range named for step phase `name`; a few microseconds when not profiling."""
    return record_function(PHASE_PREFIX + name)
