"""Memory and communication model for GPT-2 under DeepSpeed ZeRO (0.19): the preset picker.

What one GPU holds, what one node's CPU holds and what each GPU sends per optimizer step, for
ZeRO stages 0-3 with and without offload and activation checkpointing. `estimate_run` is the
trainer's start-up estimate; `plan` ranks the candidates behind `tools/pick_preset.py`.

Model states follow the ZeRO paper (Rajbhandari et al. 2020; P = parameter count): 16-bit
weights 2P, 16-bit gradients 2P, fp32 Adam states 12P (master weights 4P + m 4P + v 4P), each
divided by the data-parallel size N where the stage partitions it (ZeRO-1: optimizer states,
ZeRO-2: + gradients, ZeRO-3: + weights). Where DeepSpeed 0.19 holds more than the paper
counts, this follows DeepSpeed, as read in its source and measured on live engines
(tests/test_memory_measured.py):

* The optimizer step converts the rank's gradient partition to fp32 (4P/N) while the 16-bit
  copy is alive; DeepSpeed's own ZeRO-2 estimator counts it too ("18 = 2 + 4 + 4 + 8").
* ZeRO-2's gradient buffer keeps every tensor that overlaps the rank's partition whole, so a
  rank whose partition cuts the embedding holds all of the embedding's gradient.
* ZeRO-3 keeps a 16-bit gradient partition (`grad_partitions_flat_buffer`, 2P/N) that
  DeepSpeed's ZeRO-3 estimator leaves out; parameters of <= 1e5 elements stay whole on every
  rank; the largest module (GPT-2: the tied embedding) is gathered whole with its gradient
  (DeepSpeed's "4 x largest layer").
* fp32 training keeps 4P weights, 4P gradients and 8P Adam moments, but every ZeRO stage still
  clones a separate fp32 master partition (4P/N); only stage 0 in fp32 (a plain torch
  optimizer) has none.
"""

from __future__ import annotations

import bisect
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpt_ds.errors import ConfigError
from gpt_ds.model import ModelShape, flops_per_token

GiB = 2**30
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DS_CONFIG_DIR = Path(__file__).resolve().parents[1] / "ds_configs"

# Saved activations per layer per (sequence position x batch x width), in bytes at 16 bits.
# Korthikanti et al. 2022 count 34 (+ 5*a*s/h for the attention matrix). Measured on this
# code's GPT2LMHeadModel (SDPA, dropout 0) with saved-tensor hooks: 60. Transformers' GPT-2
# GELU ("gelu_new") is a Python tanh expression whose autograd keeps four 4h-wide tensors
# (32 vs Korthikanti's 8); with dropout 0 no masks are kept (-2); SDPA keeps q, k, v and
# its output (+2). tests/test_memory.py re-measures it.
ACT_BYTES_PER_SBH_16BIT = 60
KORTHIKANTI_SBH = 34
# SDPA (flash / memory-efficient kernels, on GPU and CPU) never materialises the a x s x s
# attention matrix: it keeps a log-sum-exp of a*s fp32 values. Eager attention would add
# 5*a*s*s*b bytes per layer (softmax output, dropout mask and output).
EAGER_ATTN_BYTES_PER_ASSB = 5
# Logits: cross-entropy keeps the fp32 log-softmax (4 bytes per vocabulary entry), and its
# backward holds two fp32 gradients of that size at once: 12 bytes x batch x seq x vocab.
LOGIT_BYTES_PER_ELEMENT = 12

# Headroom: the CUDA context, cuBLAS workspaces and NCCL buffers (1 GiB) come off the card,
# and only 90% of the rest is planned for (allocator fragmentation, transient peaks).
CUDA_CONTEXT_BYTES = 1 * GiB
GPU_USABLE_FRACTION = 0.90
CPU_USABLE_FRACTION = 0.90  # leave 10% of each node's RAM to the OS, page cache, data loader
CPU_BYTES_PER_RANK = 2 * GiB  # one rank's Python + torch + CUDA libraries, resident

# Time model (for ranking only; override on the command line).
DEFAULT_NETWORK_GBPS = 100.0  # inter-node, per node (100 Gbit Ethernet / EDR InfiniBand)
DEFAULT_INTRA_NODE_GBPS = 800.0  # per GPU, NVLink class; a PCIe-only server gets ~150
DEFAULT_PCIE_GBPS = 128.0  # GPU <-> CPU, per GPU (PCIe 4.0 x16, effective)
DEFAULT_GPU_TFLOPS = {"bf16": 100.0, "fp16": 100.0, "fp32": 25.0}  # achieved, per GPU
CPU_ADAM_PARAMS_PER_S = 2e9  # DeepSpeedCPUAdam, per node
RECOMPUTE_FACTOR = 4 / 3  # activation checkpointing re-runs the forward: 8 instead of 6 FLOPs


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


def load_preset_settings(preset: str | Path) -> ZeroSettings:
    """ZeroSettings of a ds_configs/ preset file; DeepSpeed's defaults if it is missing."""
    import json

    path = Path(preset)
    if not path.is_file():
        return ZeroSettings()
    return ZeroSettings.from_ds_config(json.loads(path.read_text()).get("zero_optimization"))


# ----------------------------------------------------------------------------- model layout


def parameter_layout(shape: ModelShape) -> list[tuple[str, int]]:
    """(name, elements) of GPT2LMHeadModel's parameters in `model.parameters()` order.

    lm_head.weight is tied to transformer.wte.weight and so appears once, as DeepSpeed sees it.
    """
    d, f = shape.n_embd, 4 * shape.n_embd
    out = [
        ("transformer.wte.weight", shape.vocab_size * d),
        ("transformer.wpe.weight", shape.block_size * d),
    ]
    for i in range(shape.n_layer):
        p = f"transformer.h.{i}."
        out += [
            (p + "ln_1.weight", d), (p + "ln_1.bias", d),
            (p + "attn.c_attn.weight", d * 3 * d), (p + "attn.c_attn.bias", 3 * d),
            (p + "attn.c_proj.weight", d * d), (p + "attn.c_proj.bias", d),
            (p + "ln_2.weight", d), (p + "ln_2.bias", d),
            (p + "mlp.c_fc.weight", d * f), (p + "mlp.c_fc.bias", f),
            (p + "mlp.c_proj.weight", f * d), (p + "mlp.c_proj.bias", d),
        ]  # fmt: skip
    return out + [("transformer.ln_f.weight", d), ("transformer.ln_f.bias", d)]


def largest_module_params(shape: ModelShape) -> int:
    """Elements of the module with the most parameters of its own (DeepSpeed's "largest layer")."""
    d = shape.n_embd
    return max(shape.vocab_size * d, shape.block_size * d, 4 * d * d + 4 * d, 3 * d * d + 3 * d)


@dataclass(frozen=True)
class _Zero12Rank:
    partition: int  # elements of the flat buffer this rank owns (padded)
    overlap: int  # elements of the whole tensors that overlap that partition
    single_tensor: bool  # the partition lies inside one tensor


def _zero12_ranks(sizes: list[int], world: int) -> list[_Zero12Rank]:
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
            ranks.append(_Zero12Rank(part, 0, True))
            continue
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_left(starts, hi) - 1
        overlap = starts[last + 1] - starts[first]
        ranks.append(_Zero12Rank(part, overlap, first == last))
    return ranks


@dataclass(frozen=True)
class _Zero3Layout:
    partition: int  # this rank's elements over all parameters (each padded to N)
    persistent: int  # elements of parameters kept whole on every rank


def _zero3_layout(shape: ModelShape, world: int, settings: ZeroSettings) -> _Zero3Layout:
    partition = persistent = 0
    for _, n in parameter_layout(shape):
        partition += math.ceil(n / world)
        within_model_cap = persistent + n <= settings.model_persistence_threshold
        if n <= settings.param_persistence_threshold and within_model_cap:
            persistent += n
    return _Zero3Layout(partition, persistent)


# ------------------------------------------------------------------------------ activations


def activation_bytes(
    shape: ModelShape,
    micro_batch_size: int,
    precision: str,
    activation_checkpointing: bool,
    sdpa: bool = True,
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
        "logits": LOGIT_BYTES_PER_ELEMENT * b * s * shape.vocab_size,
        "other": int(4 * s * b * h * scale),  # embedding output, final LayerNorm in/out
    }


# ---------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of one run: bytes per GPU (the worst rank) and per node's CPU."""

    zero_stage: int
    offload_optimizer: bool
    offload_param: bool
    world_size: int
    gpus_per_node: int
    micro_batch_size: int
    precision: str
    activation_checkpointing: bool
    num_params: int
    rank: int
    """The rank described (ZeRO-2 ranks differ slightly; by default the one holding most)."""
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
    def model_state_bytes(self) -> int:
        """Params + grads + optimizer states on the GPU (what DeepSpeed's estimators print)."""
        return self.params + self.grads + self.optimizer_states

    @property
    def total(self) -> int:
        return self.model_state_bytes + self.activations + self.buffers

    def phase_bytes(self) -> dict[str, int]:
        """Model states alive at two moments (for checks against a live engine).

        "after_backward": weights, the reduced gradient buffer, master and moments;
        "optimizer_step": weights, the fp32 step gradient and whatever reduced gradients are
        still alive (ZeRO-3's permanent buffer), master and moments. Offloaded states and
        gathered ZeRO-3 modules are excluded.
        """
        d = self.detail
        base = d["params_weights"] + d["params_persistent"] + d["master_weights"]
        base += d["adam_moments"]
        return {
            "after_backward": base + d["grads_reduced"],
            "optimizer_step": base + d["grads_fp32_step"] + d["grads_reduced_alive_at_step"],
        }

    def describe(self) -> str:
        stage = "stage 0 (DDP)" if self.zero_stage == 0 else f"ZeRO-{self.zero_stage}"
        off = []
        if self.offload_optimizer:
            off.append("optimizer")
        if self.offload_param:
            off.append("params")
        offload = f" + {' & '.join(off)} offload" if off else ""
        nodes = math.ceil(self.world_size / self.gpus_per_node)
        ckpt = "on" if self.activation_checkpointing else "off"
        return (
            f"{stage}{offload}, {self.precision}, {self.world_size} GPUs ({nodes} node"
            f"{'s' if nodes > 1 else ''}), micro-batch {self.micro_batch_size}, "
            f"activation checkpointing {ckpt}"
        )

    def format(self) -> str:
        """A few readable lines (GiB = 2**30 bytes)."""

        def g(x: int) -> str:
            return f"{x / GiB:.2f} GiB"

        return "\n".join(
            [
                f"  {self.describe()}; per GPU:",
                f"  params {g(self.params)} + grads {g(self.grads)} + optimizer states "
                f"{g(self.optimizer_states)} = model states {g(self.model_state_bytes)}",
                f"  + activations {g(self.activations)} (logits {g(self.detail['logits'])}) "
                f"+ buffers {g(self.buffers)} = {g(self.total)}",
                f"  CPU per node: {g(self.cpu_bytes)} "
                f"(model states {g(self.cpu_model_state_bytes)})",
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model_state_bytes"] = self.model_state_bytes
        out["total"] = self.total
        return out


def _check_run(shape: ModelShape, **kw: Any) -> None:
    problems = []
    if shape.n_head < 1 or shape.n_embd < 1 or shape.n_layer < 1 or shape.block_size < 1:
        problems.append(f"model sizes must be >= 1, got {shape}")
    elif shape.n_embd % shape.n_head:
        problems.append(f"n_embd {shape.n_embd} is not divisible by n_head {shape.n_head}")
    if kw["zero_stage"] not in (0, 1, 2, 3):
        problems.append(f"zero_stage must be 0, 1, 2 or 3, got {kw['zero_stage']}")
    if kw["offload_param"] and kw["zero_stage"] != 3:
        problems.append("offload_param needs ZeRO stage 3")
    if kw["offload_optimizer"] and kw["zero_stage"] == 0:
        problems.append("offload_optimizer needs ZeRO stage 1, 2 or 3")
    for name in ("world_size", "gpus_per_node", "micro_batch_size"):
        if kw[name] < 1:
            problems.append(f"{name} must be >= 1, got {kw[name]}")
    if kw["precision"] not in PRECISION_BYTES:
        problems.append(f"precision must be bf16, fp16 or fp32, got {kw['precision']!r}")
    if kw["rank"] is not None and not 0 <= kw["rank"] < max(1, kw["world_size"]):
        problems.append(f"rank must be in [0, world_size), got {kw['rank']}")
    if problems:
        raise ConfigError(problems, source="memory estimate")


def estimate_run(
    shape: ModelShape,
    *,
    zero_stage: int,
    offload_optimizer: bool,
    offload_param: bool,
    world_size: int,
    gpus_per_node: int,
    micro_batch_size: int,
    precision: str,
    activation_checkpointing: bool,
    reduce_bucket_size: int | None = None,
    allgather_bucket_size: int | None = None,
    zero_config: dict[str, Any] | ZeroSettings | None = None,
    rank: int | None = None,
) -> MemoryEstimate:
    """Predicted per-GPU and per-node-CPU memory of one DeepSpeed run of a GPT-2.

    `zero_config` is the DeepSpeed config's `zero_optimization` section (or ZeroSettings) for
    the bucket, prefetch and persistence sizes; the two bucket arguments override it; absent,
    DeepSpeed 0.19's defaults apply. `rank` picks a rank; by default the one holding the most.
    Raises ConfigError for impossible combinations.
    """
    _check_run(
        shape,
        zero_stage=zero_stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        world_size=world_size,
        gpus_per_node=gpus_per_node,
        micro_batch_size=micro_batch_size,
        precision=precision,
        rank=rank,
    )
    if isinstance(zero_config, ZeroSettings):
        settings = zero_config
    else:
        settings = ZeroSettings.from_ds_config(zero_config)
    if reduce_bucket_size is not None:
        settings = replace(settings, reduce_bucket_size=int(reduce_bucket_size))
    if allgather_bucket_size is not None:
        settings = replace(settings, allgather_bucket_size=int(allgather_bucket_size))

    gpu, cpu_rank, rank = _model_states(
        shape, zero_stage, offload_optimizer, offload_param, world_size, precision, settings, rank
    )
    act = activation_bytes(shape, micro_batch_size, precision, activation_checkpointing)
    buffers = _buffers(shape, zero_stage, world_size, precision, settings)
    ranks_per_node = min(gpus_per_node, world_size)
    startup = 4 * shape.num_params() * ranks_per_node  # every rank builds the fp32 model
    cpu_states = sum(v for k, v in cpu_rank.items() if k != "cpu_pinned_staging")
    cpu_model_states = max(startup, cpu_states * ranks_per_node)
    cpu_bytes = max(startup, (cpu_states + cpu_rank["cpu_pinned_staging"]) * ranks_per_node)
    cpu_bytes += CPU_BYTES_PER_RANK * ranks_per_node

    detail = {**gpu, **{f"activations_{k}" if k != "logits" else k: v for k, v in act.items()}}
    detail.update(buffers)
    detail.update({k: v * ranks_per_node for k, v in cpu_rank.items()})
    detail["cpu_startup_fp32_model"] = startup
    return MemoryEstimate(
        zero_stage=zero_stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        world_size=world_size,
        gpus_per_node=gpus_per_node,
        micro_batch_size=micro_batch_size,
        precision=precision,
        activation_checkpointing=activation_checkpointing,
        num_params=shape.num_params(),
        rank=rank,
        params=gpu["params_weights"] + gpu["params_persistent"] + gpu["params_gathered"],
        grads=gpu["grads_reduced"] + gpu["grads_fp32_step"] + gpu["grads_gathered"],
        optimizer_states=gpu["master_weights"] + gpu["adam_moments"],
        activations=sum(act.values()),
        buffers=sum(buffers.values()),
        cpu_model_state_bytes=cpu_model_states,
        cpu_bytes=cpu_bytes,
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
    base = dict.fromkeys(
        ["cpu_params", "cpu_grads_reduced", "cpu_grads_fp32_step", "cpu_master_weights"]
        + ["cpu_adam_moments", "cpu_pinned_staging"],
        0,
    )
    return {**base, **kw}


def _zero12_states(shape, stage, offload_optimizer, world, e, rank, gpu):
    sizes = [n for _, n in parameter_layout(shape)]
    ranks = _zero12_ranks(sizes, world)

    def grads(r: _Zero12Rank) -> tuple[int, int]:
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


def _zero3_states(shape, offload_optimizer, offload_param, world, e, settings, gpu):
    lay = _zero3_layout(shape, world, settings)
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


def _buffers(shape, stage, world, precision, settings: ZeroSettings) -> dict[str, int]:
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


# --------------------------------------------------------------------------- communication


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


# ------------------------------------------------------------------ measured (live engine)


def measured_model_state_bytes(engine) -> dict[str, int]:
    """Bytes of parameter, gradient and optimizer-state tensors this rank holds right now.

    Counts each storage once, whole (a view keeps all of its storage alive), wherever it lives
    (GPU, or CPU under offload). Call it after backward for the gradient buffers, or from inside
    the optimizer step for the fp32 step gradient; before the first step Adam has no state yet.
    Keys: params, grads, optimizer_states, total.
    """
    import torch

    seen: set[int] = set()
    out = {"params": 0, "grads": 0, "optimizer_states": 0}

    def add(cat: str, obj: Any) -> None:
        if obj is None:
            return
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "meta" or obj.numel() == 0:
                return
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key and key not in seen:
                seen.add(key)
                out[cat] += storage.nbytes()
            return
        if isinstance(obj, dict):
            obj = list(obj.values())
        if isinstance(obj, (list, tuple)):
            for item in obj:
                add(cat, item)

    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None) or opt
    # Weights: ZeRO-1/2 flat 16-bit buffer; ZeRO-3 partitions; FP16_Optimizer; the module.
    for name in (
        "bit16_groups_flat",
        "fp16_partitioned_groups_flat",
        "lp_param_buffer",
        "fp16_groups_flat",
    ):
        add("params", getattr(opt, name, None))
    for p in engine.module.parameters():
        add("params", p.data)
        add("params", getattr(p, "ds_tensor", None))
    # Optimizer states: fp32 master copies, then the inner optimizer's state (m, v, step).
    masters = []
    for name in (
        "single_partition_of_fp32_groups",
        "fp32_partitioned_groups_flat",
        "fp32_groups_flat",
        "fp32_groups",
    ):
        masters += list(getattr(opt, name, None) or [])
    add("optimizer_states", masters)
    add("optimizer_states", [s for s in getattr(inner, "state", {}).values()])
    # Gradients: DeepSpeed's buffers, the fp32 step gradients, the module's own .grad.
    for name in (
        "grads_in_partition",
        "grad_partitions_flat_buffer",
        "averaged_gradients",
        "all_grad_tensors",
    ):
        add("grads", getattr(opt, name, None))
    for m in masters:
        add("grads", getattr(m, "grad", None))
    for p in engine.module.parameters():
        add("grads", p.grad)
        add("grads", getattr(p, "grad_accum", None))
    for group in getattr(opt, "fp16_groups", None) or []:
        for p in group if isinstance(group, (list, tuple)) else []:
            add("grads", p.grad)
    out["total"] = sum(out.values())
    return out


# ------------------------------------------------------------------------ the preset picker


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
    """Achieved dense TFLOP/s per GPU (None: DEFAULT_GPU_TFLOPS for the precision)."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_gpu_bytes(self) -> int:
        return int((self.gpu_memory_gb * GiB - CUDA_CONTEXT_BYTES) * GPU_USABLE_FRACTION)

    @property
    def usable_cpu_bytes(self) -> int | None:
        if self.cpu_memory_gb is None:
            return None
        return int(self.cpu_memory_gb * GiB * CPU_USABLE_FRACTION)

    @property
    def network(self) -> float:
        return self.network_gbps if self.network_gbps is not None else DEFAULT_NETWORK_GBPS

    def check(self) -> list[str]:
        problems = []
        if self.gpus_per_node < 1:
            problems.append(f"--gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.nodes < 1:
            problems.append(f"--nodes must be >= 1, got {self.nodes}")
        for name in ("gpu_memory_gb", "cpu_memory_gb", "network_gbps", "intra_node_gbps"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                problems.append(f"--{name} must be > 0, got {v}")
        for name in ("pcie_gbps", "gpu_tflops"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                problems.append(f"--{name} must be > 0, got {v}")
        if self.gpu_memory_gb > 0 and self.usable_gpu_bytes <= 0:
            problems.append(
                f"--gpu_memory_gb {self.gpu_memory_gb} leaves nothing after the context"
            )
        return problems


# (name, stage, offload optimizer, offload params, ds_configs preset)
CANDIDATES: list[tuple[str, int, bool, bool, str | None]] = [
    ("stage 0 (DDP)", 0, False, False, None),
    ("ZeRO-1", 1, False, False, "zero1.json"),
    ("ZeRO-2", 2, False, False, "zero2.json"),
    ("ZeRO-2 + opt offload", 2, True, False, "zero2_offload.json"),
    ("ZeRO-3", 3, False, False, "zero3.json"),
    ("ZeRO-3 + opt&param offload", 3, True, True, "zero3_offload.json"),
]
MAX_MICRO_BATCH = 4096
TIE_FRACTION = 0.02
RULE = (
    "among the candidates that fit (GPU and CPU) and have a ds_configs/ preset, take the "
    f"lowest estimated step time; candidates within {TIE_FRACTION:.0%} of it are tied, and a tie "
    "goes to the lower ZeRO stage, then no offload, then no activation checkpointing, then the "
    "larger micro-batch. Stage 0 is the plain data-parallel baseline: ds_configs/ has no stage-0 "
    "preset, and ZeRO-1 sends the same bytes while holding less."
)


@dataclass
class Candidate:
    """One row of the picker's table."""

    name: str
    zero_stage: int
    offload_optimizer: bool
    offload_param: bool
    activation_checkpointing: bool
    preset: str | None
    settings_from: str
    estimate: MemoryEstimate
    """At micro-batch 1."""
    fits: bool
    why_not: list[str]
    max_micro_batch: int
    micro_batch_size: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    total_at_micro_batch: int | None = None
    comm_bytes: int = 0
    comm_s: float = 0.0
    compute_s: float = 0.0
    offload_s: float = 0.0

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s + self.offload_s

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "estimate"}
        out["estimate_at_micro_batch_1"] = self.estimate.to_dict()
        out["step_s"] = self.step_s
        return out


@dataclass
class Plan:
    shape: ModelShape
    model_name: str | None
    hardware: Hardware
    precision: str
    target_global_batch: int
    candidates: list[Candidate]
    recommendation: Candidate | None
    command: str | None
    assumptions: list[str]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommendation
        return {
            "model": {
                "name": self.model_name,
                **asdict(self.shape),
                "params": self.shape.num_params(),
            },
            "hardware": {
                **asdict(self.hardware),
                "world_size": self.hardware.world_size,
                "usable_gpu_bytes": self.hardware.usable_gpu_bytes,
                "usable_cpu_bytes": self.hardware.usable_cpu_bytes,
            },
            "precision": self.precision,
            "target_global_batch": self.target_global_batch,
            "candidates": [c.to_dict() for c in self.candidates],
            "rule": RULE,
            "recommendation": None
            if rec is None
            else {
                "name": rec.name,
                "activation_checkpointing": rec.activation_checkpointing,
                "preset": f"ds_configs/{rec.preset}",
                "micro_batch_size": rec.micro_batch_size,
                "grad_accum": rec.grad_accum,
                "global_batch": rec.global_batch,
                "command": self.command,
            },
            "assumptions": self.assumptions,
            "notes": self.notes,
        }


def _batch_split(max_micro: int, target: int, world: int) -> tuple[int, int, int]:
    """(micro-batch, accumulation, global batch): the smallest global batch >= `target`
    (exactly `target` where the GPUs divide it), then the largest micro-batch."""
    best = None
    for micro in range(1, max(1, min(max_micro, math.ceil(target / world))) + 1):
        accum = math.ceil(target / (micro * world))
        key = (micro * accum * world, -micro)
        if best is None or key < best[0]:
            best = (key, micro, accum)
    (total, _), micro, accum = best
    return micro, accum, total


def _max_micro_batch(est1: MemoryEstimate, est2: MemoryEstimate, usable: int) -> int:
    """Largest micro-batch whose total fits (memory is linear in the micro-batch)."""
    if est1.total > usable:
        return 0
    per_sequence = max(1, est2.total - est1.total)
    return min(MAX_MICRO_BATCH, 1 + (usable - est1.total) // per_sequence)


def _times(shape: ModelShape, c: Candidate, hw: Hardware, precision: str) -> None:
    micro, accum, world = c.micro_batch_size or 1, c.grad_accum or 1, hw.world_size
    tflops = hw.gpu_tflops or DEFAULT_GPU_TFLOPS[precision]
    tokens = micro * accum * shape.block_size
    recompute = RECOMPUTE_FACTOR if c.activation_checkpointing else 1.0
    c.compute_s = flops_per_token(shape) * tokens * recompute / (tflops * 1e12)
    c.comm_bytes = comm_bytes_per_step(shape, c.zero_stage, precision, world, accum)
    c.comm_s = comm_seconds(c.comm_bytes, hw.nodes, hw.network, hw.intra_node_gbps)
    part = math.ceil(shape.num_params() / world) * PRECISION_BYTES[precision]
    pcie = 0
    cpu_adam = 0.0
    if c.offload_optimizer:  # gradients down every micro-batch, updated weights up per step
        pcie += accum * part + part
        cpu_adam = shape.num_params() / hw.nodes / CPU_ADAM_PARAMS_PER_S
    if c.offload_param:  # the partition comes up for forward and for backward
        pcie += 2 * accum * part
    c.offload_s = pcie * 8 / (hw.pcie_gbps * 1e9) + cpu_adam


def _candidate(shape, hw, precision, target, spec, ckpt, config_dir: Path) -> Candidate:
    name, stage, off_opt, off_param, preset = spec
    path = config_dir / preset if preset else None
    settings = load_preset_settings(path) if path else ZeroSettings()
    source = f"ds_configs/{preset}" if path and path.is_file() else "DeepSpeed defaults"

    def est(micro: int) -> MemoryEstimate:
        return estimate_run(
            shape,
            zero_stage=stage,
            offload_optimizer=off_opt,
            offload_param=off_param,
            world_size=hw.world_size,
            gpus_per_node=hw.gpus_per_node,
            micro_batch_size=micro,
            precision=precision,
            activation_checkpointing=ckpt,
            zero_config=settings,
        )

    e1 = est(1)
    why = []
    max_micro = _max_micro_batch(e1, est(2), hw.usable_gpu_bytes)
    if max_micro == 0:
        why.append(f"GPU: needs {e1.total / GiB:.1f} GiB at micro-batch 1")
    cpu_usable = hw.usable_cpu_bytes
    if cpu_usable is not None and e1.cpu_bytes > cpu_usable:
        why.append(f"CPU: needs {e1.cpu_bytes / GiB:.1f} GiB per node")
    c = Candidate(
        name, stage, off_opt, off_param, ckpt, preset, source, e1, not why, why, max_micro
    )
    if max_micro:
        c.micro_batch_size, c.grad_accum, c.global_batch = _batch_split(
            max_micro, target, hw.world_size
        )
        c.total_at_micro_batch = est(c.micro_batch_size).total
    _times(shape, c, hw, precision)
    return c


def _choose(cands: list[Candidate]) -> Candidate | None:
    fitting = [c for c in cands if c.fits and c.preset]
    if not fitting:
        return None
    best = min(c.step_s for c in fitting)
    tied = [c for c in fitting if c.step_s <= best * (1 + TIE_FRACTION)]
    return min(
        tied,
        key=lambda c: (
            c.zero_stage,
            c.offload_optimizer or c.offload_param,
            c.activation_checkpointing,
            -(c.micro_batch_size or 0),
        ),
    )


def model_flags(shape: ModelShape, model_name: str | None) -> list[str]:
    """train.py flags that rebuild `shape`: the preset plus any field that differs from it."""
    from gpt_ds.model import MODEL_PRESETS

    name = model_name if model_name in MODEL_PRESETS else "gpt2"
    base = MODEL_PRESETS[name]
    flags = ["--model", name]
    for f in ("n_layer", "n_head", "n_embd", "block_size"):
        if getattr(shape, f) != getattr(base, f):
            flags += [f"--{f}", str(getattr(shape, f))]
    return flags


def launch_command(
    c: Candidate, shape: ModelShape, model_name: str | None, hw: Hardware, precision: str
) -> str:
    launcher = (
        f"deepspeed --num_gpus {hw.gpus_per_node}"
        if hw.nodes == 1
        else "deepspeed --hostfile hostfile"
    )
    parts = [launcher, "gpt_ds/train.py", "--deepspeed_config", f"ds_configs/{c.preset}"]
    parts += model_flags(shape, model_name)
    parts += ["--precision", precision, "--micro_batch_size", str(c.micro_batch_size)]
    parts += ["--grad_accum", str(c.grad_accum)]
    if c.activation_checkpointing:
        parts.append("--activation_checkpointing")
    return " ".join(parts)


def assumptions(hw: Hardware, precision: str) -> list[str]:
    tflops = hw.gpu_tflops or DEFAULT_GPU_TFLOPS[precision]
    net = (
        f"inter-node network {hw.network:g} Gbit/s per node"
        + ("" if hw.network_gbps is not None else " (assumed; set --network_gbps)")
        if hw.nodes > 1
        else "one node: no inter-node network"
    )
    return [
        "GB = GiB (2**30 bytes). Memory columns are per GPU at micro-batch 1, for the rank that "
        "holds the most; 'total@mb' is at the chosen micro-batch 'mb x ga'; 'GB sent' (1e9 "
        "bytes per GPU per optimizer step) and 'step s' are at that split (rows that do not fit: "
        "micro-batch 1, no accumulation).",
        f"fits: total <= {GPU_USABLE_FRACTION:.0%} of (GPU memory - "
        f"{CUDA_CONTEXT_BYTES / GiB:g} GiB for the CUDA context, cuBLAS and NCCL) = "
        f"{hw.usable_gpu_bytes / GiB:.2f} GiB usable "
        "(the 10% absorbs allocator fragmentation and transient peaks)",
        "model states (ZeRO paper, DeepSpeed 0.19 as measured): 16-bit weights 2P, 16-bit grads "
        "2P, fp32 master 4P + Adam m, v 8P; + the fp32 copy of the gradient partition made at the "
        "optimizer step (4P/N); fp32 runs: 4-byte weights and grads (stage 0: no master copy)",
        "activations (SDPA attention, dropout 0): 60*s*b*h bytes per layer at 16 bits "
        "(Korthikanti's 34 plus the Python GELU of transformers' GPT-2; no a*s^2 term: SDPA "
        "never stores the attention matrix); checkpointing: 2*s*b*h per layer + one layer; "
        "logits: 12 bytes * b*s*vocab (fp32 log-softmax and its gradients)",
        "buffers: reduce_bucket_size elements (x2 with overlap_comm) for ZeRO-1/2, x1 plus "
        "stage3_prefetch_bucket_size for ZeRO-3, taken from each preset (DeepSpeed defaults "
        "where absent); allgather_bucket_size costs nothing (DeepSpeed gathers in place)",
        f"CPU per node: each rank builds the fp32 model (4P) before deepspeed.initialize, "
        f"{CPU_BYTES_PER_RANK / GiB:g} GiB per rank process, offloaded states and pinned "
        f"staging; fits if <= {CPU_USABLE_FRACTION:.0%} of --cpu_memory_gb"
        + ("" if hw.cpu_memory_gb is not None else " (not checked: --cpu_memory_gb not given)"),
        "bytes sent per GPU per optimizer step: ring all-reduce 2(N-1)/N x grad bytes (stage "
        "0/1; ZeRO-1's reduce-scatter + all-gather is the same volume); ZeRO-2 reduce-scatters "
        "every micro-batch ((G+1)(N-1)/N x bytes); ZeRO-3 1.5x the all-reduce per micro-batch",
        f"time: the ring runs at the slower of the intra-node link ({hw.intra_node_gbps:g} "
        f"Gbit/s per GPU) and, across nodes, the node's network; {net}",
        f"step time = compute at {tflops:g} achieved TFLOP/s per GPU (x4/3 with checkpointing) "
        f"+ communication, not overlapped + offload (PCIe {hw.pcie_gbps:g} Gbit/s per GPU, CPU "
        f"Adam {CPU_ADAM_PARAMS_PER_S:.0e} params/s per node); for ranking, not a promise",
    ]


def plan(
    shape: ModelShape,
    hardware: Hardware,
    *,
    global_batch_size: int,
    precision: str,
    model_name: str | None = None,
    config_dir: Path = DS_CONFIG_DIR,
) -> Plan:
    """Every candidate's memory, fit, batch split, traffic and time, and one recommendation."""
    problems = hardware.check()
    if global_batch_size < 1:
        problems.append(f"--global_batch_size must be >= 1, got {global_batch_size}")
    if precision not in PRECISION_BYTES:
        problems.append(f"--precision must be bf16, fp16 or fp32, got {precision!r}")
    if shape.n_head < 1 or shape.n_embd % shape.n_head:
        problems.append(f"n_embd {shape.n_embd} is not divisible by n_head {shape.n_head}")
    if problems:
        raise ConfigError(problems, source="pick_preset")
    cands = [
        _candidate(shape, hardware, precision, global_batch_size, spec, ckpt, config_dir)
        for spec in CANDIDATES
        for ckpt in (False, True)
    ]
    rec = _choose(cands)
    notes = []
    if hardware.world_size > global_batch_size:
        notes.append(
            f"the target batch {global_batch_size} is smaller than the {hardware.world_size} GPUs: "
            "every GPU needs at least one sequence"
        )
    if rec and rec.global_batch != global_batch_size:
        notes.append(
            f"{global_batch_size} is not a multiple of the {hardware.world_size} GPUs: the "
            f"recommendation trains {rec.global_batch} sequences per step"
        )
    if rec is None:
        notes.append(
            "nothing fits: add GPUs or nodes, shorten --block_size, pick a smaller model, or "
            "offload to NVMe (not modelled here)"
        )
    command = launch_command(rec, shape, model_name, hardware, precision) if rec else None
    return Plan(
        shape, model_name, hardware, precision, global_batch_size, cands, rec, command,
        assumptions(hardware, precision), notes,
    )  # fmt: skip


def format_plan(p: Plan) -> str:
    """The picker's table, recommendation and assumptions as text."""
    s, hw = p.shape, p.hardware

    def g(x: int | None) -> str:
        return "-" if x is None else f"{x / GiB:.2f}"

    head = (
        f"model: {p.model_name or 'custom'}: {s.num_params():,} params ({s.n_layer} layers, "
        f"{s.n_head} heads, {s.n_embd} wide, block {s.block_size}, vocab {s.vocab_size}), "
        f"{p.precision}\nhardware: {hw.nodes} node(s) x {hw.gpus_per_node} GPUs of "
        f"{hw.gpu_memory_gb:g} GiB (usable {hw.usable_gpu_bytes / GiB:.2f} GiB), CPU "
        + (f"{hw.cpu_memory_gb:g} GiB per node" if hw.cpu_memory_gb is not None else "not given")
        + f"\ntarget: {p.target_global_batch} sequences per optimizer step\n"
    )
    cols = (
        f"{'candidate':<27} {'ckpt':<4} {'params':>6} {'grads':>6} {'optim':>6} {'activ':>6} "
        f"{'buffer':>6} {'total':>6} {'fits':<4} {'max mb':>6} {'mb x ga':>9} {'total@mb':>8} "
        f"{'GB sent':>8} {'comm s':>7} {'step s':>7} {'CPU/node':>8}  preset"
    )
    rows = [cols, "-" * len(cols)]
    for c in p.candidates:
        e = c.estimate
        split = f"{c.micro_batch_size} x {c.grad_accum}" if c.micro_batch_size else "-"
        rows.append(
            f"{c.name:<27} {'yes' if c.activation_checkpointing else 'no':<4} {g(e.params):>6} "
            f"{g(e.grads):>6} {g(e.optimizer_states):>6} {g(e.activations):>6} {g(e.buffers):>6} "
            f"{g(e.total):>6} {'yes' if c.fits else 'NO':<4} {c.max_micro_batch:>6} {split:>9} "
            f"{g(c.total_at_micro_batch):>8} {c.comm_bytes / 1e9:>8.2f} {c.comm_s:>7.3f} "
            f"{f'{c.step_s:.2f}' if c.max_micro_batch else '-':>7} {g(e.cpu_bytes):>8}  "
            f"{c.preset or '(none)'}" + (f"  <- {'; '.join(c.why_not)}" if c.why_not else "")
        )
    out = [head, *rows, ""]
    rec = p.recommendation
    if rec:
        ckpt = " with activation checkpointing" if rec.activation_checkpointing else ""
        out += [
            f"recommendation: {rec.name}{ckpt}: ds_configs/{rec.preset}, micro-batch "
            f"{rec.micro_batch_size} x grad_accum {rec.grad_accum} x {hw.world_size} GPUs = "
            f"{rec.global_batch} sequences per step; {rec.total_at_micro_batch / GiB:.2f} of "
            f"{hw.usable_gpu_bytes / GiB:.2f} GiB usable per GPU, ~{rec.step_s:.2f} s per step",
            f"  {p.command}",
        ]
    out.append(f"rule: {RULE}")
    out += [f"note: {n}" for n in p.notes]
    out.append("assumptions:")
    out += [f"  - {a}" for a in p.assumptions]
    return "\n".join(out)
