"""The per-rank memory estimate of a GPT-2 under DeepSpeed ZeRO (0.19): `estimate_run`.

What one GPU and one node's CPU hold for ZeRO stages 0-3, with and without offload and
activation checkpointing: the trainer's start-up estimate and the picker's memory column.

Model states follow the ZeRO paper (Rajbhandari et al. 2020; P = parameter count): 16-bit
weights 2P, 16-bit gradients 2P, fp32 Adam states 12P (master weights 4P + m 4P + v 4P), each
divided by the data-parallel size N where the stage partitions it (ZeRO-1: optimizer states,
ZeRO-2: + gradients, ZeRO-3: + weights). Where DeepSpeed 0.19 holds more, this follows it
(its source; live engines in tests/test_memory_measured.py):

* The step's fp32 copy of the gradient partition (4P/N; DeepSpeed's "18 = 2 + 4 + 4 + 8").
* ZeRO-2 keeps the gradient of every tensor overlapping the rank's partition whole.
* ZeRO-3 keeps a 16-bit gradient partition (2P/N) its estimator leaves out; parameters of
  <= 1e5 elements stay whole; the largest module (the tied embedding) is gathered whole with
  its gradient (DeepSpeed's "4 x largest layer").
* fp32 training still clones a separate fp32 master partition (4P/N) at every ZeRO stage;
  only stage 0 in fp32 (a plain torch optimizer) has none.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpt_ds.base.errors import ConfigError
from gpt_ds.memory.activations import activation_bytes
from gpt_ds.memory.constants import PRECISION_BYTES, GiB
from gpt_ds.memory.layout import (
    Zero12Rank,
    largest_module_params,
    parameter_layout,
    zero3_layout,
    zero12_ranks,
)
from gpt_ds.memory.settings import DeepSpeedRun, ZeroSettings
from gpt_ds.model.gpt2 import ModelShape, shape_problems

CPU_BYTES_PER_RANK = 2 * GiB  # one rank's Python + torch + CUDA libraries, resident


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of one run: bytes per GPU (the worst rank) and per node's CPU."""

    run: DeepSpeedRun
    """The run estimated, its `rank` the one described (by default the one holding most)."""
    num_params: int
    params: int
    """Working weights on the GPU: whole (stage 0-2) or this rank's partition, plus ZeRO-3's
    persistent small parameters and its gathered largest module."""
    grads: int
    """Gradients on the GPU: the reduced 16-bit (fp32 in fp32 runs) buffer plus the fp32
    partition made for the optimizer step (and ZeRO-3's gathered gradient of one module)."""
    optimizer_states: int
    """fp32 master weights and Adam's two moments on the GPU."""
    activations: int
    """Saved activations of one micro-batch, logits included."""
    buffers: int
    """DeepSpeed's reduction buckets and ZeRO-3 prefetch."""
    cpu_model_state_bytes: int
    """Per node: offloaded model states, or the start-up copy of the model if larger."""
    cpu_bytes: int
    """Per node: everything above plus pinned staging buffers and the ranks' processes."""
    detail: dict[str, int] = field(default_factory=dict)
    """The finer split (bytes) behind each figure; keys named after what they hold."""

    @property
    def rank(self) -> int:
        """The rank described."""
        return self.run.rank if self.run.rank is not None else 0

    @property
    def model_state_bytes(self) -> int:
        """Params + grads + optimizer states on the GPU (what DeepSpeed's estimators print)."""
        return self.params + self.grads + self.optimizer_states

    @property
    def total(self) -> int:
        """Everything on the GPU: model states, activations and buffers."""
        return self.model_state_bytes + self.activations + self.buffers

    @property
    def resident_model_state_bytes(self) -> int:
        """Model states held on the GPU between steps: weights (ZeRO-3's persistent ones
        included), fp32 master weights and Adam's moments; no gradients, nothing gathered."""
        keys = ("params_weights", "params_persistent", "master_weights", "adam_moments")
        return sum(self.detail.get(k, 0) for k in keys)

    @property
    def startup_bytes(self) -> int:
        """After deepspeed.initialize (no Adam moments yet) + the build: the fp32 model, or
        (ZeRO-3) the largest module twice: gathered, and its all-gather copy."""
        d = self.detail
        held = sum(d[k] for k in ("params_weights", "params_persistent", "master_weights"))
        if self.run.zero_stage == 3:  # + the permanent gradient partition and reduction bucket
            held += d["grads_reduced_alive_at_step"] + d["reduce_buckets"]
            return held + 2 * d["params_gathered"]
        return held + 4 * self.num_params

    def phase_bytes(self) -> dict[str, int]:
        """Model states alive at two moments (for checks against a live engine).

        "after_backward": weights, the reduced gradient buffer, master and moments;
        "optimizer_step": weights, the fp32 step gradient and whatever reduced gradients are
        still alive (ZeRO-3's permanent buffer), master and moments. Offloaded states and
        gathered ZeRO-3 modules are excluded.
        """
        d, base = self.detail, self.resident_model_state_bytes
        return {
            "after_backward": base + d["grads_reduced"],
            "optimizer_step": base + d["grads_fp32_step"] + d["grads_reduced_alive_at_step"],
        }

    def describe(self) -> str:
        """One line: stage, offload, precision, GPUs and nodes, micro-batch, checkpointing."""
        r = self.run
        stage = "stage 0 (DDP)" if r.zero_stage == 0 else f"ZeRO-{r.zero_stage}"
        off = []
        if r.offload_optimizer:
            off.append("optimizer")
        if r.offload_param:
            off.append("params")
        offload = f" + {' & '.join(off)} offload" if off else ""
        nodes = math.ceil(r.world_size / r.gpus_per_node)
        ckpt = "on" if r.activation_checkpointing else "off"
        return (
            f"{stage}{offload}, {r.precision}, {r.world_size} GPUs ({nodes} node"
            f"{'s' if nodes > 1 else ''}), micro-batch {r.micro_batch_size}, "
            f"activation checkpointing {ckpt}"
        )

    def format(self) -> str:
        """A few readable lines (GiB = 2**30 bytes)."""

        def g(x: int) -> str:
            return f"{x / GiB:.2f} GiB"

        loss = "chunked loss" if self.run.chunked_loss else "logits"
        return "\n".join(
            [
                f"  {self.describe()}; per GPU:",
                f"  params {g(self.params)} + grads {g(self.grads)} + optimizer states "
                f"{g(self.optimizer_states)} = model states {g(self.model_state_bytes)}",
                f"  + activations {g(self.activations)} "
                f"({loss} {g(self.detail['logits'])}) "
                f"+ buffers {g(self.buffers)} = {g(self.total)}",
                f"  CPU per node: {g(self.cpu_bytes)} "
                f"(model states {g(self.cpu_model_state_bytes)})",
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        """Flat, as `gpt-ds-pick-preset --json` has always printed it (the run's fields first)."""
        run = {k: v for k, v in asdict(self.run).items() if k != "zero"}
        out = {**run, **{k: v for k, v in asdict(self).items() if k != "run"}}
        out["rank"] = self.rank
        out["model_state_bytes"] = self.model_state_bytes
        out["total"] = self.total
        return out


def _check_run(shape: ModelShape, run: DeepSpeedRun) -> None:
    """Every reason the run cannot be estimated, raised at once as a ConfigError."""
    problems = shape_problems(shape)
    if run.zero_stage not in (0, 1, 2, 3):
        problems.append(f"zero_stage must be 0, 1, 2 or 3, got {run.zero_stage}")
    if run.offload_param and run.zero_stage != 3:
        problems.append("offload_param needs ZeRO stage 3")
    if run.offload_optimizer and run.zero_stage == 0:
        problems.append("offload_optimizer needs ZeRO stage 1, 2 or 3")
    counts = {
        "world_size": run.world_size,
        "gpus_per_node": run.gpus_per_node,
        "micro_batch_size": run.micro_batch_size,
    }
    problems += [f"{name} must be >= 1, got {v}" for name, v in counts.items() if v < 1]
    if run.precision not in PRECISION_BYTES:
        problems.append(f"precision must be bf16, fp16 or fp32, got {run.precision!r}")
    if run.rank is not None and not 0 <= run.rank < max(1, run.world_size):
        problems.append(f"rank must be in [0, world_size), got {run.rank}")
    if problems:
        raise ConfigError(problems, source="memory estimate")


def estimate_run(shape: ModelShape, run: DeepSpeedRun) -> MemoryEstimate:
    """Predicted per-GPU and per-node-CPU memory of one DeepSpeed run of a GPT-2 (`run.rank`,
    by default the rank holding the most). Raises ConfigError for impossible combinations."""
    _check_run(shape, run)
    gpu, cpu_rank, rank = _model_states(
        shape,
        run.zero_stage,
        run.offload_optimizer,
        run.offload_param,
        run.world_size,
        run.precision,
        run.zero,
        run.rank,
    )
    act = activation_bytes(
        shape,
        run.micro_batch_size,
        run.precision,
        run.activation_checkpointing,
        chunked_loss=run.chunked_loss,
    )
    buffers = _buffers(shape, run.zero_stage, run.world_size, run.precision, run.zero)
    cpu = _cpu_per_node(
        shape,
        cpu_rank,
        ranks_per_node=min(run.gpus_per_node, run.world_size),
        zero_init=run.zero_stage == 3,
    )
    act_detail = {f"activations_{k}" if k != "logits" else k: v for k, v in act.items()}
    return MemoryEstimate(
        run=replace(run, rank=rank),
        num_params=shape.num_params(),
        params=gpu["params_weights"] + gpu["params_persistent"] + gpu["params_gathered"],
        grads=gpu["grads_reduced"] + gpu["grads_fp32_step"] + gpu["grads_gathered"],
        optimizer_states=gpu["master_weights"] + gpu["adam_moments"],
        activations=sum(act.values()),
        buffers=sum(buffers.values()),
        cpu_model_state_bytes=cpu.model_states,
        cpu_bytes=cpu.total,
        detail={**gpu, **act_detail, **buffers, **cpu.detail},
    )


@dataclass(frozen=True)
class _NodeCpu:
    model_states: int  # offloaded model states of the node's ranks, or the start-up copy
    total: int  # + pinned staging buffers and the ranks' processes
    detail: dict[str, int]  # the per-node components, start-up fp32 model included


def _cpu_per_node(
    shape: ModelShape, cpu_rank: dict[str, int], ranks_per_node: int, zero_init: bool
) -> _NodeCpu:
    """One node's CPU memory from one rank's CPU components: the larger of the start-up fp32
    model and the offloaded states. Below ZeRO-3 every rank builds the whole model before
    deepspeed.initialize; under ZeRO-3 it is built partitioned (model/zero3.py), one module
    at a time whole on the host, as DeepSpeed's own estimator counts `zero_init`."""
    built = largest_module_params(shape) if zero_init else shape.num_params()
    startup = 4 * built * ranks_per_node
    states = sum(v for k, v in cpu_rank.items() if k != "cpu_pinned_staging")
    total = max(startup, (states + cpu_rank["cpu_pinned_staging"]) * ranks_per_node)
    detail = {k: v * ranks_per_node for k, v in cpu_rank.items()}
    detail["cpu_startup_fp32_model"] = startup
    return _NodeCpu(
        model_states=max(startup, states * ranks_per_node),
        total=total + CPU_BYTES_PER_RANK * ranks_per_node,
        detail=detail,
    )


def _model_states(
    shape: ModelShape,
    stage: int,
    offload_optimizer: bool,
    offload_param: bool,
    world: int,
    precision: str,
    settings: ZeroSettings,
    rank: int | None,
) -> tuple[dict[str, int], dict[str, int], int]:
    """Per-rank bytes: (GPU components, CPU components, the rank described)."""
    e = PRECISION_BYTES[precision]
    n_params = shape.num_params()
    gpu = dict.fromkeys(
        ["params_weights", "params_persistent", "params_gathered", "grads_reduced"]
        + ["grads_gathered", "grads_fp32_step", "grads_reduced_alive_at_step"]
        + ["master_weights", "adam_moments"],
        0,
    )
    if stage == 0:
        gpu["params_weights"] = e * n_params
        gpu["grads_reduced"] = e * n_params
        gpu["adam_moments"] = 8 * n_params
        if precision != "fp32":  # DeepSpeed's FP16_Optimizer: fp32 master + fp32 grads
            gpu["master_weights"] = gpu["grads_fp32_step"] = 4 * n_params
        else:  # a plain torch optimizer steps on the module's own gradients
            gpu["grads_reduced_alive_at_step"] = gpu["grads_reduced"]
        return gpu, _cpu(), 0
    if stage in (1, 2):
        return _zero12_states(shape, stage, offload_optimizer, world, e, rank, gpu)
    return _zero3_states(shape, offload_optimizer, offload_param, world, e, settings, gpu)


def _cpu(**kw: int) -> dict[str, int]:
    """One rank's CPU components, zero but for those given."""
    base = dict.fromkeys(
        ["cpu_params", "cpu_grads_reduced", "cpu_grads_fp32_step", "cpu_master_weights"]
        + ["cpu_adam_moments", "cpu_pinned_staging"],
        0,
    )
    return {**base, **kw}


def _zero12_states(
    shape: ModelShape,
    stage: int,
    offload_optimizer: bool,
    world: int,
    e: int,
    rank: int | None,
    gpu: dict[str, int],
) -> tuple[dict[str, int], dict[str, int], int]:
    """ZeRO-1/2: whole weights; gradients and optimizer states of the rank's partition."""
    sizes = [n for _, n in parameter_layout(shape)]
    ranks = zero12_ranks(sizes, world)

    def grads(r: Zero12Rank) -> tuple[int, int, int]:
        """(reduced 16-bit gradients, fp32 step copy, fp32 step gradient that is a view)."""
        reduced = e * (sum(sizes) if stage == 1 else r.overlap)
        if e == 4 and r.single_tensor:  # fp32, partition inside one tensor: the step
            return reduced, 0, 4 * r.overlap  # gradient is a view of that tensor's, no copy
        return reduced, 4 * r.partition, 0

    if rank is None:
        rank = max(range(world), key=lambda i: sum(grads(ranks[i])[:2]))
    r = ranks[rank]
    reduced, step, view = grads(r)
    gpu["params_weights"] = e * sum(sizes)
    if offload_optimizer:  # gradients stream to a pinned fp32 CPU partition
        cpu = _cpu(
            cpu_grads_fp32_step=4 * r.partition,
            cpu_master_weights=4 * r.partition,
            cpu_adam_moments=8 * r.partition,
            cpu_pinned_staging=e * r.partition,
        )
        if stage == 1:
            gpu["grads_reduced"] = reduced
        return gpu, cpu, rank
    gpu["grads_reduced"], gpu["grads_fp32_step"] = reduced, step
    gpu["grads_reduced_alive_at_step"] = view
    gpu["master_weights"], gpu["adam_moments"] = 4 * r.partition, 8 * r.partition
    return gpu, _cpu(), rank


def _zero3_states(
    shape: ModelShape,
    offload_optimizer: bool,
    offload_param: bool,
    world: int,
    e: int,
    settings: ZeroSettings,
    gpu: dict[str, int],
) -> tuple[dict[str, int], dict[str, int], int]:
    """ZeRO-3: every model state partitioned, small parameters whole, one module gathered."""
    lay = zero3_layout(shape, world, settings)
    largest = largest_module_params(shape)
    step = 4 * min(lay.partition, settings.sub_group_size)
    gpu["params_persistent"] = e * lay.persistent
    gpu["params_gathered"] = gpu["grads_gathered"] = e * largest
    cpu = _cpu()
    if offload_param:
        cpu["cpu_params"] = e * lay.partition
    else:
        gpu["params_weights"] = e * lay.partition
    if offload_optimizer:
        cpu.update(
            cpu_grads_reduced=e * lay.partition,
            cpu_grads_fp32_step=step,
            cpu_master_weights=4 * lay.partition,
            cpu_adam_moments=8 * lay.partition,
        )
    else:
        gpu["grads_reduced"], gpu["grads_fp32_step"] = e * lay.partition, step
        gpu["grads_reduced_alive_at_step"] = gpu["grads_reduced"]  # a permanent buffer
        gpu["master_weights"], gpu["adam_moments"] = 4 * lay.partition, 8 * lay.partition
    return gpu, cpu, 0


def _buffers(
    shape: ModelShape, stage: int, world: int, precision: str, settings: ZeroSettings
) -> dict[str, int]:
    """DeepSpeed's gradient-reduction buckets and ZeRO-3's parameter prefetch, in bytes."""
    e = PRECISION_BYTES[precision]
    n_params = shape.num_params()
    out = {"reduce_buckets": 0, "prefetch_bucket": 0}
    if world == 1 and stage == 0:
        return out
    if stage == 0:  # the engine all-reduces flattened buckets of up to 5e8 elements
        out["reduce_buckets"] = e * min(500_000_000, n_params)
    elif stage in (1, 2):
        out["reduce_buckets"] = (
            e * settings.reduce_bucket_size * (2 if settings.overlap(stage) else 1)
        )
    else:
        out["reduce_buckets"] = e * settings.reduce_bucket_size
        room = max(0, settings.max_live_parameters - largest_module_params(shape))
        out["prefetch_bucket"] = e * min(settings.prefetch_bucket_size, room)
    return out
