"""Bytes each GPU sends per optimizer step under each ZeRO stage, and the time that takes."""

from __future__ import annotations

from gpt_ds.memory.constants import PRECISION_BYTES
from gpt_ds.model.gpt2 import ModelShape


def comm_bytes_per_step(
    shape: ModelShape, zero_stage: int, precision: str, world_size: int, grad_accum: int = 1
) -> int:
    """Bytes each GPU sends per optimizer step of `grad_accum` micro-batches.

    Ring all-reduce of B gradient bytes: 2(N-1)/N x B. ZeRO-1/2 reduce-scatter gradients and
    all-gather the updated 16-bit weights: the same 2(N-1)/N x B. ZeRO-2 reduce-scatters on
    every micro-batch (stage 0/1 only at the step), ZeRO-3 also gathers weights twice per
    micro-batch: 1.5x the all-reduce volume per micro-batch (ZeRO paper).
    """
    n = world_size
    if n <= 1:
        return 0
    half = (n - 1) / n * PRECISION_BYTES[precision] * shape.num_params()  # one ring pass
    passes = {0: 2, 1: 2, 2: grad_accum + 1, 3: 3 * grad_accum}[zero_stage]
    return int(passes * half)


def grad_comm_bytes_per_step(
    shape: ModelShape, zero_stage: int, precision: str, world_size: int
) -> int:
    """Bytes each GPU sends per optimizer step without accumulation (ZeRO paper's volumes)."""
    return comm_bytes_per_step(shape, zero_stage, precision, world_size, grad_accum=1)


def comm_seconds(
    bytes_per_gpu: int, nodes: int, network_gbps: float, intra_node_gbps: float
) -> float:
    """Ring time: every GPU sends `bytes_per_gpu`; across nodes each node's network carries the
    same volume per ring, so the slower of the intra-node link and the node's network rules."""
    gbps = min(intra_node_gbps, network_gbps) if nodes > 1 else intra_node_gbps
    return bytes_per_gpu * 8 / (gbps * 1e9)
