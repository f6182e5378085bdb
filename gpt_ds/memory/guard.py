"""Refuse a run that cannot fit before any model is built: a run whose own estimate needs more
memory than the device (or, on CPU, the host) lets it use would otherwise swap, hang, die of CUDA
OOM at its first step or be OOM-killed with no step done.

"Lets it use" is defined here and the picker plans with it (`usable_gpu_memory`: 90% of what
the CUDA context leaves of a GPU; `usable_cpu_memory`: 90% of a node's RAM), so a run the
picker would refuse is refused here too. A
node's RAM is the smaller of the machine's and its cgroup's limit (Slurm --mem, docker -m): the
kernel OOM-kills at the cgroup limit whatever the machine has.
"""

from __future__ import annotations

import os
from pathlib import Path
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
CGROUP_ROOT = Path("/sys/fs/cgroup")
NO_CGROUP_LIMIT = 1 << 62  # cgroup v1 writes "no limit" as LONG_MAX rounded down to a page


class NodeRam(NamedTuple):
    """The RAM a node's ranks share, and which limit it is (named in the guard's message)."""

    bytes: int
    limit: str


def cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """This process's cgroup from /proc/self/cgroup: {"v2": path} from the `0::path` line,
    {"v1": path} from the line of v1's memory controller (`4:memory:/slurm/uid_1/job_7`)."""
    found = {}
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            found["v2"] = path
        elif "memory" in controllers.split(","):
            found["v1"] = path
    return found


def read_limit(path: Path) -> int | None:
    """A cgroup memory limit file's bytes; None: no file, no access, `max` or v1's no limit."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= NO_CGROUP_LIMIT:
        return None
    return int(text)


def cgroup_memory_limit(proc_cgroup: str, root: Path = CGROUP_ROOT) -> int | None:
    """The tightest memory limit on this process's cgroup or a parent (a job's limit is often
    on the parent of its step's cgroup): v2 `memory.max` (at `root`, or `root/unified` on a
    hybrid host), v1 `memory/.../memory.limit_in_bytes`. None: no limit set. A path the mount
    does not show (a container's own cgroup namespace) is walked up to the mount's root."""
    paths = cgroup_paths(proc_cgroup)
    places = []
    if "v2" in paths:
        places += [(base, paths["v2"], "memory.max") for base in (root, root / "unified")]
    if "v1" in paths:
        places.append((root / "memory", paths["v1"], "memory.limit_in_bytes"))
    limits = []
    for base, path, name in places:
        here = base / path.lstrip("/")
        for d in [here, *here.parents]:
            if d != base and base not in d.parents:
                break
            limits.append(read_limit(d / name))
    return min((v for v in limits if v is not None), default=None)


def ram_limit(physical: int, cgroup: int | None) -> NodeRam:
    """The node's RAM for the run: the machine's, or its cgroup's limit where that is lower."""
    if cgroup is not None and cgroup < physical:
        return NodeRam(cgroup, f"the cgroup limit {cgroup / GiB:.2f} GiB (Slurm --mem / docker -m)")
    return NodeRam(physical, f"this machine's {physical / GiB:.2f} GiB of RAM")


def node_ram() -> NodeRam:
    """This node's RAM as the kernel will enforce it: physical RAM, or the cgroup limit."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:  # not Linux
        proc_cgroup = ""
    return ram_limit(physical, cgroup_memory_limit(proc_cgroup))


def node_ram_bytes() -> int:
    """node_ram()'s bytes (the smaller of the RAM and the cgroup limit)."""
    return node_ram().bytes


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
    the host together. `ram`: the node's RAM and the name of its limit (default:
    `node_ram()`, the machine's or the cgroup's, whichever is lower).
    """
    ram = ram or node_ram()
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
    if host_need > usable_cpu_memory(ram.bytes):
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
