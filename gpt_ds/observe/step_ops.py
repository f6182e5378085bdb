"""What a profiled step asks of the device, counted from a `--profile` trace: the operators that
launch a kernel and the host syncs, per optimizer step, split by phase.

Exact and repeatable on any machine, so they measure host overhead where no GPU is at hand: a
GPU step pays a launch (~5-10 us of host time) per kernel-launching operator and a drained
queue per host sync. An operator launches a kernel when it is a leaf (`aten::`/`c10d::`, no
operator but views nested inside it on its thread) and not itself a view, alias or allocation.
Each counts in the innermost `gpt_ds.phase::<name>` range its start falls in (whatever its
thread: a GPU's backward runs on autograd's own), else in `trainer`; syncs are
`aten::_local_scalar_dense` (`.item()`, `bool()`) and `host_sync::<kind>` ranges
(`observe/host_syncs.py`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpt_ds.base.phases import PHASE_PREFIX
from gpt_ds.observe.host_syncs import SYNC_PREFIX

PHASES = ("forward", "loss", "backward", "step", "trainer")
LOCAL_SCALAR = "aten::_local_scalar_dense"
# leaf operators that launch no kernel: views, aliases, allocations, no-op conversions
# fmt: off
NO_KERNEL = frozenset("aten::" + name for name in (
    "view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand", "slice",
    "select", "squeeze", "unsqueeze", "reshape", "split", "split_with_sizes", "chunk", "narrow",
    "unbind", "flatten", "detach", "alias", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "resize_", "resolve_conj", "resolve_neg", "to", "contiguous",
    "lift_fresh", "_has_compatible_shallow_copy_type",
))
# fmt: on
# torch's own optimizer step: on CPU ranks its AdamW reads its step count (`.item()`); a GPU's
# fused or foreach AdamW keeps it on the device. Syncs inside are named apart.
TORCH_OPTIMIZER = "Optimizer.step#"
TORCH_OPTIMIZER_NOTE = " in torch's optimizer"
STEPS_IN_NAME = re.compile(r"\.steps(\d+)-(\d+)\.json$")


@dataclass
class StepOps:
    """Per optimizer step: kernel-launching operators and host syncs, by phase and by name."""

    steps: int
    launches: Counter = field(default_factory=Counter)  # phase -> count over all steps
    syncs: Counter = field(default_factory=Counter)  # phase -> count
    local_scalar: int = 0  # aten::_local_scalar_dense over all steps
    by_op: Counter = field(default_factory=Counter)  # operator name -> launches
    by_sync: Counter = field(default_factory=Counter)  # "phase: kind" -> syncs
    strict_leaves: int = 0  # over all steps, `_leaf_ops(strict=True)` less NO_KERNEL

    def per_step(self, total: int) -> float:
        return total / self.steps

    @property
    def total_launches(self) -> float:
        return self.per_step(sum(self.launches.values()))

    @property
    def total_syncs(self) -> float:
        return self.per_step(sum(self.syncs.values()))

    @property
    def local_scalar_per_step(self) -> float:
        return self.per_step(self.local_scalar)


def _complete_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]


def _leaf_ops(events: list[dict], strict: bool = False) -> list[dict]:
    """`aten::`/`c10d::` events with no such event nested inside them on their thread, views
    and other NO_KERNEL operators aside (`mm` calls `resolve_conj`: still a matmul kernel);
    `strict`: with none at all nested (the count of earlier measurements)."""
    ops = [e for e in events if e["name"].startswith(("aten::", "c10d::"))]
    has_child: set[int] = set()
    by_thread: dict[tuple, list[dict]] = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in thread:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack and (strict or e["name"] not in NO_KERNEL):
                has_child.add(id(stack[-1]))
            stack.append(e)
    return [e for e in ops if id(e) not in has_child]


def _phase_of(ts: float, phases: list[tuple[float, float, str]]) -> str:
    """The innermost phase range holding `ts` (the shortest one), else "trainer"."""
    inside = [(end - start, name) for start, end, name in phases if start <= ts < end]
    return min(inside)[1] if inside else "trainer"


def count_step_ops(trace_path: Path, steps: int | None = None) -> StepOps:
    """Count a trace written by `--profile` (its file name gives the steps it covers)."""
    if steps is None:
        named = STEPS_IN_NAME.search(str(trace_path))
        assert named, f"{trace_path}: not a --profile trace name (*.steps<first>-<last>.json)"
        first, last = map(int, named.groups())
        steps = last - first + 1
    events = _complete_events(json.loads(Path(trace_path).read_text()))
    phases = [
        (e["ts"], e["ts"] + e["dur"], e["name"][len(PHASE_PREFIX) :])
        for e in events
        if e["name"].startswith(PHASE_PREFIX)
    ]
    result = StepOps(steps)
    result.strict_leaves = sum(e["name"] not in NO_KERNEL for e in _leaf_ops(events, True))
    for e in _leaf_ops(events):
        if e["name"] in NO_KERNEL:
            continue
        phase = _phase_of(e["ts"], phases)
        result.launches[phase] += 1
        result.by_op[e["name"]] += 1
        if e["name"] == LOCAL_SCALAR:
            result.local_scalar += 1
    for e in events:
        kind = e["name"][len(SYNC_PREFIX) :] if e["name"].startswith(SYNC_PREFIX) else None
        if kind is None and e["name"] == LOCAL_SCALAR:
            kind = "item/bool"
        if kind is not None and not _inside_marked_sync(e, events):
            phase = _phase_of(e["ts"], phases)
            if _inside(e, events, TORCH_OPTIMIZER):
                kind += TORCH_OPTIMIZER_NOTE
            result.syncs[phase] += 1
            result.by_sync[f"{phase}: {kind}"] += 1
    return result


def _inside(event: dict, events: list[dict], prefix: str) -> bool:
    """Whether `event` starts inside a range named `prefix...` on its thread."""
    return any(
        e["name"].startswith(prefix)
        and e.get("tid") == event.get("tid")
        and e["ts"] <= event["ts"] < e["ts"] + e["dur"]
        for e in events
    )


def _inside_marked_sync(event: dict, events: list[dict]) -> bool:
    """A `_local_scalar_dense` made by a marked `.item()`: the same sync, counted once."""
    return event["name"] == LOCAL_SCALAR and _inside(event, events, SYNC_PREFIX)


def step_ops_table(ops: StepOps, top: int = 8) -> str:
    """Per optimizer step: launches and syncs by phase, then the busiest operators and every
    kind of sync, as a plain-text table."""
    lines = [f"{'phase':<10} {'kernel launches':>16} {'host syncs':>11}"]
    for name in PHASES:
        lines.append(
            f"{name:<10} {ops.per_step(ops.launches[name]):>16.0f} "
            f"{ops.per_step(ops.syncs[name]):>11.1f}"
        )
    lines.append(f"{'total':<10} {ops.total_launches:>16.0f} {ops.total_syncs:>11.1f}")
    lines.append(f"({LOCAL_SCALAR}: {ops.local_scalar_per_step:.1f} per step)")
    busiest = ", ".join(f"{n} {ops.per_step(c):.0f}" for n, c in ops.by_op.most_common(top))
    lines.append(f"busiest operators: {busiest}")
    if ops.by_sync:
        kinds = ", ".join(f"{k} {ops.per_step(c):.1f}" for k, c in sorted(ops.by_sync.items()))
        lines.append(f"host syncs: {kinds}")
    return "\n".join(lines)
