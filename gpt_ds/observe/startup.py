"""What a run prints at start-up so the user sees what the config implies: who each rank is,
the model and batch arithmetic, the predicted memory per rank, the communication per step,
and (after the first step) the measured model states next to the prediction."""

from __future__ import annotations

import os
import socket

from gpt_ds.base import dist, logs
from gpt_ds.dsconfig.resolve import ResolvedDsConfig
from gpt_ds.memory.estimate import MemoryEstimate, comm_bytes_per_step
from gpt_ds.model.gpt2 import ModelShape
from gpt_ds.observe.metrics import peak_memory_gib


def rank_banner() -> None:
    """One line per rank: where it runs (every rank prints: a missing line is a missing rank)."""
    node = os.environ.get("CROSS_RANK", os.environ.get("GROUP_RANK", "0"))
    logs.whole_line(  # past the log level: every rank's, whole
        f"rank {dist.rank()}/{dist.world_size()} on host {socket.gethostname()} node {node} "
        f"local_rank {dist.local_rank()} device {dist.device()}"
    )


def run_summary(model_name: str, shape: ModelShape, resolved: ResolvedDsConfig, data) -> None:
    """The model, what the DeepSpeed config resolved to, and the tokens per iteration."""
    dist.print0(
        f"model {model_name}: {shape.n_layer} layers, {shape.n_head} heads, {shape.n_embd} "
        f"wide, block {shape.block_size}, {shape.num_params() / 1e6:.2f}M parameters"
    )
    for note in resolved.notes:
        dist.print0(note)
    tokens = resolved.train_batch_size * shape.block_size
    dist.print0(
        f"tokens per iteration: {tokens:,}; data: {data.train_tokens:,} train / "
        f"{data.val_tokens:,} val tokens"
    )
    if data.is_mixture:
        dist.print0(f"data mixture: {data.describe()}")


def communication_plan(shape: ModelShape, resolved: ResolvedDsConfig) -> float | None:
    """Print the bytes each rank sends per optimizer step and the time that implies on the
    measured all-reduce rate; returns the expected seconds per step (None on one rank)."""
    world, stage = dist.world_size(), resolved.zero_stage
    if world <= 1:  # nothing sent (and the probe's module not imported)
        return None
    from gpt_ds.observe.allreduce_rate import allreduce_send_rate

    nbytes = comm_bytes_per_step(shape, stage, resolved.precision, world, resolved.grad_accum)
    rate = allreduce_send_rate()
    seconds = nbytes / rate
    dist.print0(
        f"communication: {nbytes / 1e6:,.1f} MB sent per rank per optimizer step "
        f"(ZeRO-{stage}, {resolved.precision}, grad_accum {resolved.grad_accum}); measured "
        f"all-reduce rate {rate * 8 / 1e9:.2f} Gbit/s -> ~{seconds * 1000:.0f} ms per step. "
        "On slow networks raise --grad_accum."
    )
    return seconds


def model_states(engine, estimate: MemoryEstimate) -> None:
    """Measured model-state bytes of each rank next to the prediction, after the first step
    (when Adam's moments exist and the step's gradient buffers are released)."""
    from gpt_ds.memory.measure import measured_model_state_bytes  # after the first step only

    measured = measured_model_state_bytes(engine)
    held = measured["params"] + measured["optimizer_states"]
    per_rank, peaks = zip(*dist.gather_objects((held, peak_memory_gib())), strict=True)
    predicted = estimate.resident_model_state_bytes
    dist.print0(
        f"model states per rank between steps (weights + optimizer): predicted "
        f"{predicted / 2**30:.3f} GiB, measured "
        + ", ".join(f"rank {r} {b / 2**30:.3f} GiB" for r, b in enumerate(per_rank))
        + f"; predicted peak during the step {estimate.model_state_bytes / 2**30:.3f} GiB"
    )
    dist.print0(
        "peak memory per rank after step 1: "
        + ", ".join(f"rank {r} {p:.2f} GiB" for r, p in enumerate(peaks))
        + f"; predicted {estimate.total / 2**30:.2f} GiB"
        + (" + the process itself (CPU)" if dist.device().type == "cpu" else "")
    )


def startup_memory(estimate: MemoryEstimate, before_gib: float) -> None:
    """Each rank's peak memory once the engine exists (GPU allocator, or RSS on CPU), and how
    much of it came with the model and engine (above `before_gib`, the rank's peak before the
    model was built), printed next to the prediction."""
    peaks, before = zip(*dist.gather_objects((peak_memory_gib(), before_gib)), strict=True)
    dist.print0(
        "memory after start-up, peak per rank (of which model and engine): "
        + ", ".join(
            f"rank {r} {p:.2f} ({p - b:.2f}) GiB"
            for r, (p, b) in enumerate(zip(peaks, before, strict=True))
        )
        + f"; predicted model and engine {estimate.startup_bytes / 2**30:.2f} GiB, "
        + f"{estimate.total / 2**30:.2f} GiB during the step"
    )


def print_memory_estimate(est: MemoryEstimate) -> None:
    dist.print0("memory estimate per rank:\n" + est.format())
