"""The ZeRO preset picker behind tools/pick_preset.py: every candidate's memory, fit, batch
split, traffic and time on a given cluster, and one recommendation (as text: choice_text.py).

The candidates are the ds_configs/ presets, each resolved as the trainer resolves it
(`resolve_ds_config`, then `DeepSpeedRun.from_resolved`): their ZeRO stage, offload and bucket
sizes come from the preset files, nowhere else. The launch command the tool prints is built by
the command (gpt_ds/commands/pick_preset.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.schema import PRESET_DIR, PRESETS, load_ds_config
from gpt_ds.dsconfig.settings import MachineFacts, RunSettings
from gpt_ds.memory.estimate import (
    ACT_BYTES_PER_SBH_16BIT,
    CPU_BYTES_PER_RANK,
    PRECISION_BYTES,
    DeepSpeedRun,
    GiB,
    MemoryEstimate,
    comm_bytes_per_step,
    comm_seconds,
    estimate_run,
)
from gpt_ds.memory.guard import (
    CPU_USABLE_FRACTION,
    CUDA_CONTEXT_BYTES,
    GPU_USABLE_FRACTION,
    usable_cpu_memory,
    usable_gpu_memory,
)
from gpt_ds.model.gpt2 import ModelShape, flops_per_token, shape_problems

DS_CONFIG_DIR = PRESET_DIR  # the presets, installed or in a checkout

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


# Time model (for ranking only; the links are `Hardware`'s, above).
DEFAULT_GPU_TFLOPS = {"bf16": 100.0, "fp16": 100.0, "fp32": 25.0}  # achieved, per GPU
CPU_ADAM_PARAMS_PER_S = 2e9  # DeepSpeedCPUAdam, per node
RECOMPUTE_FACTOR = 4 / 3  # activation checkpointing re-runs the forward: 8 instead of 6 FLOPs
LOSS = "chunked"  # the trainer's default --loss: no full logits (memory/estimate.py)


# What the picker tries (each with and without activation checkpointing): the plain
# data-parallel baseline (no preset: DeepSpeed's defaults at stage 0), then every preset.
CANDIDATES: list[str | None] = [None, *(f"{name}.json" for name in PRESETS)]
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
        """Estimated seconds per optimizer step: compute + communication + offload."""
        return self.compute_s + self.comm_s + self.offload_s

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "estimate"}
        out["estimate_at_micro_batch_1"] = self.estimate.to_dict()
        out["step_s"] = self.step_s
        return out


@dataclass
class PresetChoice:
    """Every candidate for one model on one cluster, and the recommendation."""

    shape: ModelShape
    model_name: str | None
    hardware: Hardware
    precision: str
    target_global_batch: int
    candidates: list[Candidate]
    recommendation: Candidate | None
    assumptions: list[str]
    notes: list[str]
    command: str | None = None
    """The launch command of the recommendation: the command module's to fill in."""
    optimizer: str = "adamw"
    """What the optimizer states are: "adamw", or "muon" (estimate.muon_states)."""

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
            "optimizer": self.optimizer,
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
    best: tuple[tuple[int, int], int, int] | None = None
    for micro in range(1, max(1, min(max_micro, math.ceil(target / world))) + 1):
        accum = math.ceil(target / (micro * world))
        key = (micro * accum * world, -micro)
        if best is None or key < best[0]:
            best = (key, micro, accum)
    assert best is not None  # the range holds micro-batch 1 at least
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


def preset_run(
    preset: str | None,
    shape: ModelShape,
    hw: Hardware,
    precision: str,
    config_dir: Path,
    optimizer: str = "adamw",
) -> DeepSpeedRun:
    """The run a preset describes on `hw` at micro-batch 1 with `optimizer`, resolved as the
    trainer resolves it (run/plan.py), with the facts of the cluster planned for (not of the
    machine the picker runs on); None: the stage-0 baseline, DeepSpeed's defaults. The preset's
    own optimizer section is AdamW's; `optimizer` says whose states the estimate counts."""
    if preset is None:
        return DeepSpeedRun(
            zero_stage=0,
            offload_optimizer=False,
            offload_param=False,
            world_size=hw.world_size,
            gpus_per_node=hw.gpus_per_node,
            micro_batch_size=1,
            precision=precision,
            activation_checkpointing=False,
            loss=LOSS,
            optimizer=optimizer,
        )
    settings = RunSettings(
        world_size=hw.world_size,
        micro_batch_size=1,
        decay_iters=1,
        precision=precision,
        hidden_size=shape.n_embd,
    )
    path = config_dir / preset
    cluster = MachineFacts.gpu_cluster(hw.world_size, hw.gpus_per_node, precision)
    resolved = resolve_ds_config(load_ds_config(path), settings, facts=cluster, source=str(path))
    run = DeepSpeedRun.from_resolved(
        resolved,
        world_size=hw.world_size,
        gpus_per_node=hw.gpus_per_node,
        activation_checkpointing=False,
        loss=LOSS,
    )
    return dataclasses.replace(run, optimizer=optimizer)


def candidate_name(run: DeepSpeedRun) -> str:
    """A candidate's row name, from its stage and offload: "ZeRO-2 + opt offload"."""
    if run.zero_stage == 0:
        return "stage 0 (DDP)"
    offload = {(True, True): " + opt&param offload", (True, False): " + opt offload"}
    offload[(False, True)] = " + param offload"
    return f"ZeRO-{run.zero_stage}" + offload.get((run.offload_optimizer, run.offload_param), "")


def _candidate(
    shape: ModelShape,
    hw: Hardware,
    target: int,
    preset: str | None,
    base: DeepSpeedRun,
    ckpt: bool,
) -> Candidate:
    """One row: memory at micro-batch 1 and 2, the fit, the batch split and the step time."""

    def est(micro: int) -> MemoryEstimate:
        run = dataclasses.replace(base, micro_batch_size=micro, activation_checkpointing=ckpt)
        return estimate_run(shape, run)

    e1 = est(1)
    max_micro = _max_micro_batch(e1, est(2), hw.usable_gpu_bytes)
    why = _why_not(e1, max_micro, hw)
    c = Candidate(
        name=candidate_name(base),
        zero_stage=base.zero_stage,
        offload_optimizer=base.offload_optimizer,
        offload_param=base.offload_param,
        activation_checkpointing=ckpt,
        preset=preset,
        settings_from=f"ds_configs/{preset}" if preset else "DeepSpeed defaults",
        estimate=e1,
        fits=not why,
        why_not=why,
        max_micro_batch=max_micro,
    )
    if max_micro:
        c.micro_batch_size, c.grad_accum, c.global_batch = _batch_split(
            max_micro, target, hw.world_size
        )
        c.total_at_micro_batch = est(c.micro_batch_size).total
    _times(shape, c, hw, base.precision)
    return c


def _why_not(e1: MemoryEstimate, max_micro: int, hw: Hardware) -> list[str]:
    """Why a candidate does not fit: GPU memory at micro-batch 1, CPU memory per node."""
    why = []
    if max_micro == 0:
        why.append(f"GPU: needs {e1.total / GiB:.1f} GiB at micro-batch 1")
    cpu_usable = hw.usable_cpu_bytes
    if cpu_usable is not None and e1.cpu_bytes > cpu_usable:
        why.append(f"CPU: needs {e1.cpu_bytes / GiB:.1f} GiB per node")
    return why


def _choose(cands: list[Candidate]) -> Candidate | None:
    """The recommendation by RULE (None: nothing with a preset fits)."""
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


def assumptions(hw: Hardware, precision: str, optimizer: str = "adamw") -> list[str]:
    """The assumptions behind every figure of a choice, one sentence each, with the values
    used."""
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
        "optimizer step (4P/N); fp32 runs: 4-byte weights and grads (stage 0: no master copy)"
        + _muon_assumption(optimizer),
        f"activations (SDPA attention, dropout 0): {ACT_BYTES_PER_SBH_16BIT}*s*b*h bytes per "
        "layer at 16 bits (Korthikanti's 34, as measured on GPT-2 with torch's tanh GELU; no "
        "a*s^2 term: SDPA never stores the attention matrix); checkpointing: 2*s*b*h per layer "
        "+ one layer; "
        "logits: 12 bytes * b*s*vocab (fp32 log-softmax and its gradients)",
        "buffers: reduce_bucket_size elements (x2 with overlap_comm) for ZeRO-1/2, x1 plus "
        "stage3_prefetch_bucket_size for ZeRO-3, taken from each preset (DeepSpeed defaults "
        "where absent); allgather_bucket_size costs nothing (DeepSpeed gathers in place)",
        "CPU per node: below ZeRO-3 each rank builds the fp32 model (4P) before "
        "deepspeed.initialize (ZeRO-3 builds it partitioned: its largest module, 4L), "
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


def choose_preset(
    shape: ModelShape,
    hardware: Hardware,
    *,
    global_batch_size: int,
    precision: str,
    model_name: str | None = None,
    config_dir: Path = DS_CONFIG_DIR,
    optimizer: str = "adamw",
) -> PresetChoice:
    """Every candidate's memory, fit, batch split, traffic and time, and one recommendation."""
    _check_inputs(shape, hardware, global_batch_size, precision)
    cands = []
    for preset in CANDIDATES:
        base = preset_run(preset, shape, hardware, precision, config_dir, optimizer)
        for ckpt in (False, True):
            cands.append(_candidate(shape, hardware, global_batch_size, preset, base, ckpt))
    rec = _choose(cands)
    return PresetChoice(
        shape=shape,
        model_name=model_name,
        hardware=hardware,
        precision=precision,
        target_global_batch=global_batch_size,
        candidates=cands,
        recommendation=rec,
        assumptions=assumptions(hardware, precision, optimizer),
        notes=_notes(hardware, global_batch_size, rec),
        optimizer=optimizer,
    )


def _muon_assumption(optimizer: str) -> str:
    if optimizer != "muon":
        return ""
    return (
        "; --optimizer muon: the hidden matrices keep Muon's momentum instead of Adam's m, v "
        "(ZeRO-1/2: for the whole matrices a rank's partition touches, in the gradient's dtype, "
        "twice, beside their whole gradients; ZeRO-3: 4 bytes per partition element and "
        "all-gather buffers up to 256 MiB; offloaded optimizers counted as Adam)"
    )


def _check_inputs(shape: ModelShape, hw: Hardware, global_batch_size: int, precision: str) -> None:
    """Every problem of the inputs, raised at once, named by the pick_preset flags."""
    problems = hw.check()
    if global_batch_size < 1:
        problems.append(f"--global_batch_size must be >= 1, got {global_batch_size}")
    if precision not in PRECISION_BYTES:
        problems.append(f"--precision must be bf16, fp16 or fp32, got {precision!r}")
    problems += shape_problems(shape)
    if problems:
        raise ConfigError(problems, source="pick_preset")


def _notes(hw: Hardware, global_batch_size: int, rec: Candidate | None) -> list[str]:
    """What the user should know about the batch and the recommendation (or its absence)."""
    notes = []
    if hw.world_size > global_batch_size:
        notes.append(
            f"the target batch {global_batch_size} is smaller than the {hw.world_size} GPUs: "
            "every GPU needs at least one sequence"
        )
    if rec and rec.global_batch != global_batch_size:
        notes.append(
            f"{global_batch_size} is not a multiple of the {hw.world_size} GPUs: the "
            f"recommendation trains {rec.global_batch} sequences per step"
        )
    if rec is None:
        notes.append(
            "nothing fits: add GPUs or nodes, shorten --block_size, pick a smaller model, or "
            "offload to NVMe (not modelled here)"
        )
    return notes
