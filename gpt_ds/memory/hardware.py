"""The cluster a plan is for: GPUs, memory, links, and what of each memory a plan may use."""

from __future__ import annotations

from dataclasses import dataclass

from gpt_ds.memory.estimate import GiB

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


# Links (for ranking only; override on the command line).
DEFAULT_NETWORK_GBPS = 100.0  # inter-node, per node (100 Gbit Ethernet / EDR InfiniBand)
DEFAULT_INTRA_NODE_GBPS = 800.0  # per GPU, NVLink class; a PCIe-only server gets ~150
DEFAULT_PCIE_GBPS = 128.0  # GPU <-> CPU, per GPU (PCIe 4.0 x16, effective)


@dataclass(frozen=True)
class Hardware:
    """The cluster a plan is for. GB here means GiB (2**30 bytes), as nvidia-smi reports."""

    gpus_per_node: int
    nodes: int
    gpu_memory_gb: float
    cpu_memory_gb: float | None = None
    network_gbps: float | None = None
    """Inter-node bandwidth per node, Gbit/s (None: DEFAULT_NETWORK_GBPS where nodes > 1)."""
    intra_node_gbps: float = DEFAULT_INTRA_NODE_GBPS
    pcie_gbps: float = DEFAULT_PCIE_GBPS
    gpu_tflops: float | None = None
    """Achieved dense TFLOP/s per GPU (None: the picker's DEFAULT_GPU_TFLOPS for the precision)."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_gpu_bytes(self) -> int:
        """What a plan may fill on each GPU: 90% of what the CUDA context leaves."""
        return usable_gpu_memory(self.gpu_memory_gb * GiB)

    @property
    def usable_cpu_bytes(self) -> int | None:
        """What a plan may fill of each node's RAM (None: not given, not checked)."""
        if self.cpu_memory_gb is None:
            return None
        return usable_cpu_memory(self.cpu_memory_gb * GiB)

    @property
    def network(self) -> float:
        """Inter-node Gbit/s per node, the default where none was given."""
        return self.network_gbps if self.network_gbps is not None else DEFAULT_NETWORK_GBPS

    def check(self) -> list[str]:
        """Every problem, named by the tools/pick_preset.py flag that sets it."""
        problems = []
        if self.gpus_per_node < 1:
            problems.append(f"--gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.nodes < 1:
            problems.append(f"--nodes must be >= 1, got {self.nodes}")
        for name in (
            "gpu_memory_gb",
            "cpu_memory_gb",
            "network_gbps",
            "intra_node_gbps",
            "pcie_gbps",
            "gpu_tflops",
        ):
            v = getattr(self, name)
            if v is not None and v <= 0:
                problems.append(f"--{name} must be > 0, got {v}")
        if self.gpu_memory_gb > 0 and self.usable_gpu_bytes <= 0:
            problems.append(
                f"--gpu_memory_gb {self.gpu_memory_gb} leaves nothing after the context"
            )
        return problems
