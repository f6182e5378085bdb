"""The per-rank memory estimate of a GPT-2 under DeepSpeed ZeRO (0.19): `estimate_run`, and
its parts: the run's inputs (`ZeroSettings`, `DeepSpeedRun`), where the parameters lie and how
ZeRO partitions them, what autograd keeps, and the bytes each GPU sends per step.

What one GPU and one node's CPU hold for ZeRO stages 0-3, with and without offload and
activation checkpointing: the trainer's start-up estimate and the picker's memory column.

Model states follow the ZeRO paper (Rajbhandari et al. 2020; P = parameter count): 16-bit
weights 2P, 16-bit gradients 2P, fp32 Adam states 12P (master weights 4P + m 4P + v 4P), each
divided by the data-parallel size N where the stage partitions it (ZeRO-1: optimizer states,
ZeRO-2: + gradients, ZeRO-3: + weights). Where DeepSpeed 0.19 holds more, this follows it
(read in its source, and checked against live engines):

* The step's fp32 copy of the gradient partition (4P/N; DeepSpeed's "18 = 2 + 4 + 4 + 8").
* ZeRO-2 keeps the gradient of every tensor overlapping the rank's partition whole.
* ZeRO-3 keeps a 16-bit gradient partition (2P/N) its estimator leaves out; parameters of
  <= 1e5 elements stay whole; the largest module (the tied embedding) is gathered whole with
  its gradient (DeepSpeed's "4 x largest layer").
* fp32 training still clones a separate fp32 master partition (4P/N) at every ZeRO stage;
  only stage 0 in fp32 (a plain torch optimizer) has none.
"""

from __future__ import annotations

import bisect
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.optimization import steps_fused_adam
from gpt_ds.dsconfig.resolve import ResolvedDsConfig
from gpt_ds.model.gpt2 import LOSS_KINDS, ModelShape, chunk_rows, is_muon_matrix, shape_problems

# What of a run costs memory besides the model: the zero_optimization sizes (`ZeroSettings`,
# from a DeepSpeed config or preset) and the run itself (`DeepSpeedRun`).


@dataclass(frozen=True)
class ZeroSettings:
    """The zero_optimization settings that cost memory, with DeepSpeed 0.19's defaults."""

    reduce_bucket_size: int = 500_000_000
    """Elements per gradient-reduction bucket (ZeRO-1/2/3)."""
    allgather_bucket_size: int = 500_000_000
    """Elements per ZeRO-1/2 all-gather shard. Costs no memory in DeepSpeed 0.19: it gathers in
    place into the flat 16-bit buffer (all_gather_into_tensor)."""
    overlap_comm: bool | None = None
    """Double-buffer the reduction bucket. None: DeepSpeed's default (on for ZeRO-3 only)."""
    prefetch_bucket_size: int = 50_000_000
    """ZeRO-3: elements of parameters gathered ahead of use."""
    param_persistence_threshold: int = 100_000
    """ZeRO-3: parameters of at most this many elements stay whole on every rank."""
    model_persistence_threshold: int = sys.maxsize
    """ZeRO-3: cap on the total elements kept whole."""
    max_live_parameters: int = 1_000_000_000
    """ZeRO-3: cap on gathered elements alive at once."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3: elements per optimizer sub-group (bounds the fp32 gradient made per step)."""

    _DS_KEYS = {
        "reduce_bucket_size": "reduce_bucket_size",
        "allgather_bucket_size": "allgather_bucket_size",
        "overlap_comm": "overlap_comm",
        "prefetch_bucket_size": "stage3_prefetch_bucket_size",
        "param_persistence_threshold": "stage3_param_persistence_threshold",
        "model_persistence_threshold": "stage3_model_persistence_threshold",
        "max_live_parameters": "stage3_max_live_parameters",
        "sub_group_size": "sub_group_size",
    }

    @classmethod
    def from_ds_config(cls, zero_section: dict[str, Any] | None) -> ZeroSettings:
        """Settings from a DeepSpeed `zero_optimization` section; "auto" or absent: defaults."""
        values: dict[str, Any] = {}
        for name, ds_key in cls._DS_KEYS.items():
            plain = ds_key.removeprefix("stage3_")
            for key in (ds_key, plain):
                v = (zero_section or {}).get(key)
                if isinstance(v, bool) and name == "overlap_comm":
                    values[name] = v
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    values[name] = int(v)
        return cls(**values)

    def overlap(self, zero_stage: int) -> bool:
        return self.overlap_comm if self.overlap_comm is not None else zero_stage == 3


@dataclass(frozen=True)
class DeepSpeedRun:
    """What of one DeepSpeed run decides its memory, besides the model's shape: the input of
    `estimate_run`, built by the trainer's plan (`from_resolved`), the picker and the tests."""

    zero_stage: int
    offload_optimizer: bool
    offload_param: bool
    world_size: int
    gpus_per_node: int
    micro_batch_size: int
    precision: str
    activation_checkpointing: bool
    loss: str = "full"
    """How the LM loss is taken (--loss; gpt2.LOSS_KINDS): what its logits cost (`logit_bytes`)."""
    zero: ZeroSettings = ZeroSettings()
    """Bucket, prefetch and persistence sizes; DeepSpeed 0.19's defaults unless given."""
    rank: int | None = None
    """The rank to describe; None: the one holding the most (ZeRO-2 ranks differ slightly)."""
    optimizer: str = "adamw"
    """"adamw", or "muon": Muon's momentum for GPT-2's hidden matrices (`muon_states`)."""
    fused_adam: bool = True
    """DeepSpeed's FusedAdam steps; False for any other (torch's AdamW, Muon): at stage 0 in
    16 bits DeepSpeed then wraps it in FP16_UnfusedOptimizer, whose fp32 gradient copies sit
    beside the 16-bit gradients during the step (FP16_Optimizer's flat one replaces them)."""

    @classmethod
    def from_resolved(
        cls,
        resolved: ResolvedDsConfig,
        *,
        world_size: int,
        gpus_per_node: int,
        activation_checkpointing: bool,
        loss: str,
    ) -> DeepSpeedRun:
        """The run a resolved DeepSpeed config describes, on `world_size` ranks."""
        zero = resolved.config.get("zero_optimization", {})
        return cls(
            zero_stage=resolved.zero_stage,
            offload_optimizer=zero.get("offload_optimizer", {}).get("device", "none") != "none",
            offload_param=zero.get("offload_param", {}).get("device", "none") != "none",
            world_size=world_size,
            gpus_per_node=gpus_per_node,
            micro_batch_size=resolved.micro_batch_size,
            precision=resolved.precision,
            activation_checkpointing=activation_checkpointing,
            loss=loss,
            zero=ZeroSettings.from_ds_config(zero),
            optimizer="muon" if resolved.optimizer == "muon" else "adamw",
            fused_adam=steps_fused_adam(resolved.config),
        )


# Units shared by the memory model, the communication model and the preset picker.

GiB = 2**30
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


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
    """fp32 master weights, Adam's two moments and (Muon) Muon's momentum on the GPU."""
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
        return self.detail.get("muon_momentum", 0) + sum(self.detail.get(k, 0) for k in keys)

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

        loss = LOSS_NAMES.get(self.run.loss, self.run.loss)
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
    if run.loss not in LOSS_KINDS:
        problems.append(f"loss must be one of {', '.join(LOSS_KINDS)}, got {run.loss!r}")
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
        run.fused_adam,
    )
    if run.optimizer == "muon" and not run.offload_optimizer:
        rank = muon_states(shape, run, gpu, rank)
    act = activation_bytes(
        shape,
        run.micro_batch_size,
        run.precision,
        run.activation_checkpointing,
        loss=run.loss,
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
        optimizer_states=gpu["master_weights"] + gpu["adam_moments"] + gpu["muon_momentum"],
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
    fused_adam: bool,
) -> tuple[dict[str, int], dict[str, int], int]:
    """Per-rank bytes: (GPU components, CPU components, the rank described)."""
    e = PRECISION_BYTES[precision]
    n_params = shape.num_params()
    gpu = dict.fromkeys(
        ["params_weights", "params_persistent", "params_gathered", "grads_reduced"]
        + ["grads_gathered", "grads_fp32_step", "grads_reduced_alive_at_step"]
        + ["master_weights", "adam_moments", "muon_momentum"],
        0,
    )
    if stage == 0:
        gpu["params_weights"] = e * n_params
        gpu["grads_reduced"] = e * n_params
        gpu["adam_moments"] = 8 * n_params
        if precision != "fp32":  # DeepSpeed's FP16_Optimizer: fp32 master + fp32 grads
            gpu["master_weights"] = gpu["grads_fp32_step"] = 4 * n_params
            if not fused_adam:  # FP16_UnfusedOptimizer: the 16-bit gradients stay too
                gpu["grads_reduced_alive_at_step"] = gpu["grads_reduced"]
        else:  # a plain torch optimizer steps on the module's own gradients
            gpu["grads_reduced_alive_at_step"] = gpu["grads_reduced"]
        return gpu, _cpu(), 0
    if stage in (1, 2):
        return _zero12_states(shape, stage, offload_optimizer, world, e, rank, gpu)
    return _zero3_states(shape, offload_optimizer, offload_param, world, e, settings, gpu)


# DeepSpeed 0.19's ZeRO-3 keeps Muon's all-gather buffers between steps, up to this many bytes
# (the ZeRO-3 optimizer's _muon_allgather_max_cached_bytes).
MUON_GATHER_CACHE_BYTES = 256 << 20


def muon_groups(shape: ModelShape) -> list[list[int]]:
    """The element counts of a Muon run's param groups, in DeepSpeed's order, split by gpt2.py
    `param_groups`' rule: the hidden matrices, then the other matrices (wte and wpe), then
    biases and LayerNorms."""
    groups: list[list[int]] = [[], [], []]
    for name, dims in parameter_layout(shape):
        group = 0 if is_muon_matrix(name, dims) else 1 if len(dims) >= 2 else 2
        groups[group].append(math.prod(dims))
    return groups


def muon_states(shape: ModelShape, run: DeepSpeedRun, gpu: dict[str, int], rank: int) -> int:
    """`gpu` with Muon's state in place of Adam's for the hidden matrices, as DeepSpeed 0.19's
    MuonWithAuxAdam keeps it; returns the rank described. Offloaded optimizers are counted as
    AdamW (not measured with Muon).

    Stage 0 and ZeRO-3: one fp32 momentum per hidden element (the partition under ZeRO-3),
    instead of Adam's two; ZeRO-3 also keeps the all-gather buffers of whole matrices and
    momenta, up to MUON_GATHER_CACHE_BYTES, and steps each group on its own. ZeRO-1/2
    (`_zero12_muon`) differ more."""
    if run.zero_stage in (1, 2):
        return _zero12_muon(shape, run, gpu)
    world = max(1, run.world_size) if run.zero_stage == 3 else 1
    groups = muon_groups(shape)
    parts = [sum(math.ceil(n / world) for n in sizes) for sizes in groups]
    gpu["adam_moments"] -= 8 * parts[0]
    gpu["muon_momentum"] = 4 * parts[0]
    if run.zero_stage == 3:
        e = PRECISION_BYTES[run.precision]  # the buffers are in the communication dtype
        whole = e * sum(groups[0]) * (world + 1) // world  # gathered and own
        gpu["muon_momentum"] += min(MUON_GATHER_CACHE_BYTES, whole)
        # each group is a sub-group of its own, stepped one at a time: the fp32 step
        # gradient of the largest one at once
        gpu["grads_fp32_step"] = 4 * min(max(parts), run.zero.sub_group_size)
    return rank


def _zero12_muon(shape: ModelShape, run: DeepSpeedRun, gpu: dict[str, int]) -> int:
    """ZeRO-1/2: each param group is partitioned on its own; a rank keeps the whole gradient
    of every Muon matrix its partition touches (Muon orthogonalises whole matrices) beside the
    reduced ones, and Muon's momentum, in the gradient's dtype, for those whole matrices, twice
    (the committed one and the step's staged copy); Adam's moments for the rest only."""
    e = PRECISION_BYTES[run.precision]
    groups = [zero12_ranks(sizes, run.world_size) for sizes in muon_groups(shape)]

    def held(r: int) -> tuple[int, int]:
        """(reduced gradient bytes, Muon's whole-matrix elements) of rank r."""
        ranks = [g[r] for g in groups]
        reduced = e * (shape.num_params() if run.zero_stage == 1 else sum(x.overlap for x in ranks))
        return reduced, ranks[0].overlap

    rank = run.rank if run.rank is not None else max(range(run.world_size), key=held)
    reduced, muon = held(rank)
    hidden, *adamw = (g[rank] for g in groups)
    gpu["grads_reduced"] = gpu["grads_reduced_alive_at_step"] = reduced + e * muon
    # the step goes group by group, each group's fp32 gradient made while the later groups'
    # reduced ones are still held: at most the largest group's beside all reduced gradients
    # (in fp32 a partition inside one tensor is stepped on a view of its gradient, no copy)
    copies = [0 if e == 4 and x.single_tensor else 4 * x.partition for x in (hidden, *adamw)]
    gpu["grads_fp32_step"] = max(copies)
    gpu["master_weights"] = 4 * (hidden.partition + sum(x.partition for x in adamw))
    gpu["adam_moments"] = 8 * sum(x.partition for x in adamw)
    gpu["muon_momentum"] = 2 * e * muon
    return rank


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
    sizes = parameter_sizes(shape)
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


# Where GPT-2's parameters lie: the tensors in order, and ZeRO's partition of them per rank.


def parameter_layout(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of GPT2LMHeadModel's parameters in `model.parameters()` order, each weight
    as transformers stores it (Conv1D's are (in, out)).

    lm_head.weight is tied to transformer.wte.weight and so appears once, as DeepSpeed sees it.
    """
    d, f = shape.n_embd, 4 * shape.n_embd
    out: list[tuple[str, tuple[int, ...]]] = [
        ("transformer.wte.weight", (shape.vocab_size, d)),
        ("transformer.wpe.weight", (shape.block_size, d)),
    ]
    for i in range(shape.n_layer):
        p = f"transformer.h.{i}."
        out += [
            (p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)),
            (p + "attn.c_attn.weight", (d, 3 * d)), (p + "attn.c_attn.bias", (3 * d,)),
            (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)),
            (p + "ln_2.weight", (d,)), (p + "ln_2.bias", (d,)),
            (p + "mlp.c_fc.weight", (d, f)), (p + "mlp.c_fc.bias", (f,)),
            (p + "mlp.c_proj.weight", (f, d)), (p + "mlp.c_proj.bias", (d,)),
        ]  # fmt: skip
    return out + [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]


def parameter_sizes(shape: ModelShape) -> list[int]:
    """The element counts of `parameter_layout`, in its order."""
    return [math.prod(dims) for _, dims in parameter_layout(shape)]


def largest_module_params(shape: ModelShape) -> int:
    """Elements of the module with the most parameters of its own (DeepSpeed's "largest layer")."""
    d = shape.n_embd
    return max(shape.vocab_size * d, shape.block_size * d, 4 * d * d + 4 * d, 3 * d * d + 3 * d)


@dataclass(frozen=True)
class Zero12Rank:
    """One rank's share of ZeRO-1/2's flat buffer, in elements."""

    partition: int  # elements of the flat buffer this rank owns (padded)
    overlap: int  # elements of the whole tensors that overlap that partition
    single_tensor: bool  # the partition lies inside one tensor


def zero12_ranks(sizes: list[int], world: int) -> list[Zero12Rank]:
    """DeepSpeed ZeRO-1/2's partitioning of the flat buffer (padded to 2*N), rank by rank."""
    total = sum(sizes)
    align = 2 * world  # nccl_start_alignment_factor x world size
    part = math.ceil(total / align) * align // world
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    ranks = []
    for r in range(world):
        lo, hi = r * part, min((r + 1) * part, total)
        if lo >= hi:
            ranks.append(Zero12Rank(partition=part, overlap=0, single_tensor=True))
            continue
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_left(starts, hi) - 1
        overlap = starts[last + 1] - starts[first]
        ranks.append(Zero12Rank(partition=part, overlap=overlap, single_tensor=first == last))
    return ranks


@dataclass(frozen=True)
class Zero3Layout:
    """One rank's ZeRO-3 parameter elements."""

    partition: int  # this rank's elements over all parameters (each padded to N)
    persistent: int  # elements of parameters kept whole on every rank


def zero3_layout(shape: ModelShape, world: int, settings: ZeroSettings) -> Zero3Layout:
    """DeepSpeed ZeRO-3's partition of every parameter (each padded to N) and its persistent
    parameters (the small ones, up to the model-wide cap), kept whole on every rank."""
    partition = persistent = 0
    for n in parameter_sizes(shape):
        partition += math.ceil(n / world)
        within_model_cap = persistent + n <= settings.model_persistence_threshold
        if n <= settings.param_persistence_threshold and within_model_cap:
            persistent += n
    return Zero3Layout(partition=partition, persistent=persistent)


# Activation memory: what autograd keeps for backward on one GPU for one micro-batch.

# Saved activations per layer per (sequence position x batch x width), in bytes at 16 bits.
# Korthikanti et al. 2022 count 34 (+ 5*a*s/h for the attention matrix). Measured on this
# code's GPT2LMHeadModel (SDPA, dropout 0, torch's tanh GELU: model/training_model.py
# use_fused_gelu) with saved-tensor hooks: 36. With dropout 0 no masks are kept (-2); SDPA
# keeps q, k, v and its output (+2); the GELU keeps its 4h-wide input, as Korthikanti count
# (transformers' own "gelu_new" keeps four such tensors: 60).
ACT_BYTES_PER_SBH_16BIT = 36
# SDPA (flash / memory-efficient kernels, on GPU and CPU) never materialises the a x s x s
# attention matrix: it keeps a log-sum-exp of a*s fp32 values. Eager attention would add
# 5*a*s*s*b bytes per layer (softmax output, dropout mask and output).
EAGER_ATTN_BYTES_PER_ASSB = 5
# Logits: cross-entropy keeps the fp32 log-softmax (4 bytes per vocabulary entry), and its
# backward holds two fp32 gradients of that size at once: 12 bytes x batch x seq x vocab.
LOGIT_BYTES_PER_ELEMENT = 12


# The chunked loss at its peak, per logit of one chunk: the chunk's fp32 logits beside their
# fp32 softmax (training_model.py `_chunk_loss_and_grad`), measured by tests/test_memory.py.
CHUNK_BYTES_PER_LOGIT = 8


def chunked_loss_bytes(shape: ModelShape, micro_batch_size: int, precision: str) -> tuple[int, int]:
    """(kept for backward, transient in forward) bytes of the chunked loss (training_model.py),
    whose sum is its forward's peak.

    Kept: the gradients of the hidden states (tokens x width) and of the head's weight (vocab
    x width), in the run precision. Transient: the weight gradient's fp32 accumulator (in place
    of the kept 16-bit one until the end; in fp32 runs it is the kept one) and one chunk's
    logits and softmax (CHUNK_BYTES_PER_LOGIT). The chunk is a GPU's (on CPU it is smaller: an
    over-estimate there), and a micro-batch of one chunk, which accumulates nothing, is counted
    as if it did (an over-estimate, which keeps the picker's memory linear in the micro-batch).
    """
    tokens, vocab = micro_batch_size * shape.block_size, shape.vocab_size
    rows = min(chunk_rows(vocab), tokens)
    return chunked_loss_parts(tokens, vocab, shape.n_embd, PRECISION_BYTES[precision], rows)


def chunked_loss_parts(tokens: int, vocab: int, width: int, w: int, rows: int) -> tuple[int, int]:
    """`chunked_loss_bytes` for `tokens` hidden states of `width` against a `vocab`-row head,
    `w` bytes a value, in chunks of `rows` tokens."""
    kept = tokens * width * w + vocab * width * w
    return kept, vocab * width * (4 - w) + rows * vocab * CHUNK_BYTES_PER_LOGIT


def deepspeed_loss_bytes(
    shape: ModelShape, micro_batch_size: int, precision: str
) -> tuple[int, int]:
    """(kept for backward, made in backward) bytes of DeepSpeed's chunked cross-entropy over
    the logits (--loss deepspeed; model/training_model.py).

    Kept: the logits in the run precision (tokens x vocab x w), and per token its fp32
    log-sum-exp and int64 target. Made in backward, while those are alive: the logits'
    gradient, in their own dtype. No fp32 (tokens x vocab) tensor: on GPUs a Triton kernel
    reads the logits once per pass; elsewhere its PyTorch backend adds a 256 MiB fp32 block,
    left out here (the GPU's figure, as for the chunked loss).
    """
    tokens = micro_batch_size * shape.block_size
    logits = tokens * shape.vocab_size * PRECISION_BYTES[precision]
    return logits + tokens * (4 + 8), logits


# Names of the loss kinds (gpt2.LOSS_KINDS) in MemoryEstimate.format's activations part.
LOSS_NAMES = {"chunked": "chunked loss", "deepspeed": "DeepSpeed's loss", "full": "logits"}


def logit_bytes(shape: ModelShape, micro_batch_size: int, precision: str, loss: str) -> int:
    """Peak bytes of the LM head's loss for one micro-batch, by `loss` kind (gpt2.LOSS_KINDS):
    full: the fp32 logits' LOGIT_BYTES_PER_ELEMENT x tokens x vocab (GPT2LMHeadModel's loss);
    deepspeed: the logits and their gradient in the run precision (deepspeed_loss_bytes);
    chunked: the chunked loss's two gradients and one chunk (chunked_loss_bytes)."""
    if loss == "chunked":
        return sum(chunked_loss_bytes(shape, micro_batch_size, precision))
    if loss == "deepspeed":
        return sum(deepspeed_loss_bytes(shape, micro_batch_size, precision))
    return LOGIT_BYTES_PER_ELEMENT * micro_batch_size * shape.block_size * shape.vocab_size


def activation_bytes(
    shape: ModelShape,
    micro_batch_size: int,
    precision: str,
    activation_checkpointing: bool,
    sdpa: bool = True,
    loss: str = "full",
) -> dict[str, int]:
    """Bytes kept for backward on one GPU: {"layers", "logits", "other"}.

    Without checkpointing every layer keeps ACT_BYTES_PER_SBH_16BIT x s*b*h (x2 in fp32).
    With it (non-reentrant, per block) each layer keeps only its input, s*b*h values, and one
    layer's full set is rebuilt at a time during backward.
    """
    s, b, h = shape.block_size, micro_batch_size, shape.n_embd
    scale = PRECISION_BYTES[precision] / 2
    full_layer = ACT_BYTES_PER_SBH_16BIT * s * b * h * scale
    if not sdpa:
        full_layer += EAGER_ATTN_BYTES_PER_ASSB * shape.n_head * s * s * b * scale
    if activation_checkpointing:
        layers = shape.n_layer * 2 * s * b * h * scale + full_layer
    else:
        layers = shape.n_layer * full_layer
    return {
        "layers": int(layers),
        "logits": logit_bytes(shape, micro_batch_size, precision, loss),
        "other": int(4 * s * b * h * scale),  # embedding output, final LayerNorm in/out
    }


# Bytes each GPU sends per optimizer step under each ZeRO stage, and the time that takes.


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


def comm_seconds(
    bytes_per_gpu: int, nodes: int, network_gbps: float, intra_node_gbps: float
) -> float:
    """Ring time: every GPU sends `bytes_per_gpu`; across nodes each node's network carries the
    same volume per ring, so the slower of the intra-node link and the node's network rules."""
    gbps = min(intra_node_gbps, network_gbps) if nodes > 1 else intra_node_gbps
    return bytes_per_gpu * 8 / (gbps * 1e9)
