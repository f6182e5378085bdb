"""The phases of a training step (forward, loss, backward, the engine's step) as the names of
profiler ranges, so a `--profile` trace can be counted phase by phase (`observe/step_ops.py`):
`with record_function(FORWARD):`, a few microseconds when not profiling."""

from __future__ import annotations

PHASE_PREFIX = "gpt_ds.phase::"
FORWARD = PHASE_PREFIX + "forward"
LOSS = PHASE_PREFIX + "loss"
BACKWARD = PHASE_PREFIX + "backward"
STEP = PHASE_PREFIX + "step"
