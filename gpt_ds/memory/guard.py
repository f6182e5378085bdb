"""Refuse a run that cannot fit before any model is built: a run whose own estimate needs more
memory than the device (or, on CPU, the host) has would otherwise swap, hang or be OOM-killed
with no step done."""

from __future__ import annotations

import os

from gpt_ds.errors import ConfigError
from gpt_ds.memory.constants import GiB
from gpt_ds.memory.estimate import CPU_BYTES_PER_RANK, MemoryEstimate

# One CPU-only rank's process before its model (Python, torch, DeepSpeed, transformers; no
# CUDA libraries): 0.32-0.33 GiB measured (BENCHMARKS.md "Scale", tests/test_startup_memory.py
# checks it stays below this). The estimate's CPU_BYTES_PER_RANK (2 GiB) is a GPU rank's.
CPU_ONLY_RANK_BYTES = GiB // 2

FIXES = (
    "a smaller --micro_batch_size (with a larger --grad_accum for the same batch) or "
    "--block_size, --activation_checkpointing, more ranks, a higher ZeRO stage or offload "
    "(the zero3 and zero2_offload presets; tools/pick_preset.py, gpt-ds-pick-preset, compares "
    "them)"
)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory_bytes(local_rank: int) -> int | None:
    """This rank's GPU memory, or None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(local_rank).total_memory


def host_bytes_needed(est: MemoryEstimate, ranks_per_node: int, *, on_cpu: bool) -> int:
    """One node's RAM for the run: the estimate's CPU side, and on CPU ranks also every rank's
    "device" part, with a CPU-only process in place of a GPU rank's (no CUDA libraries)."""
    if not on_cpu:
        return est.cpu_bytes
    process_saving = (CPU_BYTES_PER_RANK - CPU_ONLY_RANK_BYTES) * ranks_per_node
    return est.cpu_bytes - process_saving + est.total * ranks_per_node


def check_fits(
    est: MemoryEstimate, *, ranks_per_node: int, device_bytes: int | None, host_bytes: int
) -> None:
    """A ConfigError, with the estimate and the fixes, when the run cannot fit.

    On GPUs each rank's estimate must fit its GPU and the node's CPU part its RAM; on CPU the
    ranks' "device" memory is the host's too, so all of it must fit the host together.
    """
    problems = []
    if device_bytes is not None and est.total > device_bytes:
        problems.append(
            f"the estimate is {est.total / GiB:.2f} GiB per GPU (activations "
            f"{est.activations / GiB:.2f} GiB), the GPU has {device_bytes / GiB:.2f} GiB"
        )
    host_need = host_bytes_needed(est, ranks_per_node, on_cpu=device_bytes is None)
    if host_need > host_bytes:
        where = f"{ranks_per_node} rank(s) on CPU" if device_bytes is None else "the CPU side"
        problems.append(
            f"the estimate for {where} is {host_need / GiB:.2f} GiB per node (per rank "
            f"{est.total / GiB:.2f} GiB, activations {est.activations / GiB:.2f} GiB), this "
            f"machine has {host_bytes / GiB:.2f} GiB of RAM"
        )
    if problems:
        problems.append(f"fix: {FIXES}; or pass --ignore_memory_estimate to start anyway")
        raise ConfigError(problems, source="memory estimate")
