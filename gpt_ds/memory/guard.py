"""Refuse a run that cannot fit before any model is built: a run whose own estimate needs more
memory than the device (or, on CPU, the host) lets it use would otherwise swap, hang, die of CUDA
OOM at its first step or be OOM-killed with no step done.

"Lets it use" is defined here and the picker plans with it (`usable_gpu_memory`: 90% of what
the CUDA context leaves of a GPU; `usable_cpu_memory`: 90% of a node's RAM), so a run the
picker would refuse is refused here too. A node's RAM is the smaller of the machine's and its
cgroup's limit (Slurm --mem, docker -m; launch/machine.py `node_ram` reads both): the kernel
OOM-kills at the cgroup limit whatever the machine has.
"""

from __future__ import annotations

from typing import NamedTuple

from gpt_ds.base.errors import ConfigError
from gpt_ds.memory.estimate import CPU_BYTES_PER_RANK, GiB, MemoryEstimate

# Headroom: the CUDA context, cuBLAS workspaces and NCCL buffers (1 GiB) come off the card,
# and only 90% of the rest is planned for (allocator fragmentation, transient peaks).
CUDA_CONTEXT_BYTES = 1 * GiB
GPU_USABLE_FRACTION = 0.90
CPU_USABLE_FRACTION = 0.90  # leave 10% of each node's RAM to the OS, page cache, data loader


def usable_gpu_memory(total_bytes: float) -> int:
    """What a run may fill of a GPU of `total_bytes`: 90% of what the CUDA context leaves. The
    picker plans with it and the trainer's memory guard refuses above it (one definition)."""
    return int((total_bytes - CUDA_CONTEXT_BYTES) * GPU_USABLE_FRACTION)


def usable_cpu_memory(total_bytes: float) -> int:
    """What a run may fill of a node's RAM (or its cgroup limit): 90%, as for the GPU."""
    return int(total_bytes * CPU_USABLE_FRACTION)


# One CPU-only rank's process before its model (Python, torch, DeepSpeed, transformers; no
# CUDA libraries): 0.32-0.33 GiB measured, so half a GiB bounds it. The estimate's
# CPU_BYTES_PER_RANK (2 GiB) is a GPU rank's.
CPU_ONLY_RANK_BYTES = GiB // 2

FIXES = (
    "a smaller --micro_batch_size (with a larger --grad_accum for the same batch) or "
    "--block_size, --activation_checkpointing, more ranks, a higher ZeRO stage or offload "
    "(the zero3 and zero2_offload presets; tools/pick_preset.py, gpt-ds-pick-preset, compares "
    "them)"
)


class NodeRam(NamedTuple):
    """The RAM a node's ranks share, and which limit it is (named in the guard's message)."""

    bytes: int
    limit: str


def ram_limit(physical: int, cgroup: int | None) -> NodeRam:
    """The node's RAM for the run: the machine's, or its cgroup's limit where that is lower."""
    if cgroup is not None and cgroup < physical:
        return NodeRam(cgroup, f"the cgroup limit {cgroup / GiB:.2f} GiB (Slurm --mem / docker -m)")
    return NodeRam(physical, f"this machine's {physical / GiB:.2f} GiB of RAM")


def host_bytes_needed(est: MemoryEstimate, ranks_per_node: int, *, on_cpu: bool) -> int:
    """One node's RAM for the run: the estimate's CPU side, and on CPU ranks also every rank's
    "device" part, with a CPU-only process in place of a GPU rank's (no CUDA libraries)."""
    if not on_cpu:
        return est.cpu_bytes
    process_saving = (CPU_BYTES_PER_RANK - CPU_ONLY_RANK_BYTES) * ranks_per_node
    return est.cpu_bytes - process_saving + est.total * ranks_per_node


def check_fits(
    est: MemoryEstimate,
    *,
    ranks_per_node: int,
    device_bytes: int | None,
    ram: NodeRam | None = None,
) -> None:
    """A ConfigError, with the estimate and the fixes, when the run cannot fit.

    On GPUs each rank's estimate must fit what the picker lets a run use of its GPU
    (`usable_gpu_memory` of `device_bytes`, the card's total), and the node's CPU part 90% of
    its RAM; on CPU the ranks' "device" memory is the host's too, so all of it must fit 90% of
    the host together. `ram`: the node's RAM and the name of its limit (launch/machine.py
    `node_ram`: the machine's or the cgroup's, whichever is lower); None for a machine whose
    RAM is not known, whose host side is then not checked.
    """
    problems = []
    if device_bytes is not None and est.total > usable_gpu_memory(device_bytes):
        problems.append(
            f"the estimate is {est.total / GiB:.2f} GiB per GPU (activations "
            f"{est.activations / GiB:.2f} GiB), more than the "
            f"{usable_gpu_memory(device_bytes) / GiB:.2f} GiB a run may use of this "
            f"{device_bytes / GiB:.2f} GiB GPU ({GPU_USABLE_FRACTION:.0%} of what is left after "
            f"{CUDA_CONTEXT_BYTES / GiB:g} GiB for the CUDA context, cuBLAS and NCCL; the rest "
            "absorbs allocator fragmentation: what tools/pick_preset.py plans with)"
        )
    host_need = host_bytes_needed(est, ranks_per_node, on_cpu=device_bytes is None)
    if ram is not None and host_need > usable_cpu_memory(ram.bytes):
        where = f"{ranks_per_node} rank(s) on CPU" if device_bytes is None else "the CPU side"
        problems.append(
            f"the estimate for {where} is {host_need / GiB:.2f} GiB per node (per rank "
            f"{est.total / GiB:.2f} GiB, activations {est.activations / GiB:.2f} GiB), more than "
            f"the {usable_cpu_memory(ram.bytes) / GiB:.2f} GiB a run may use: "
            f"{CPU_USABLE_FRACTION:.0%} of {ram.limit}"
        )
    if problems:
        problems.append(f"fix: {FIXES}; or pass --ignore_memory_estimate to start anyway")
        raise ConfigError(problems, source="memory estimate")
