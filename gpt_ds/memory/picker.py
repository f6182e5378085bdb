"""The ZeRO preset picker behind tools/pick_preset.py: every candidate's memory, fit, batch
split, traffic and time on a given cluster, one recommendation, and the text that shows them."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpt_ds.errors import ConfigError
from gpt_ds.memory.communication import comm_bytes_per_step, comm_seconds
from gpt_ds.memory.constants import PRECISION_BYTES, GiB
from gpt_ds.memory.estimate import CPU_BYTES_PER_RANK, MemoryEstimate, estimate_run
from gpt_ds.memory.settings import ZeroSettings, load_preset_settings
from gpt_ds.model import ModelShape, flops_per_token

DS_CONFIG_DIR = Path(__file__).resolve().parents[2] / "ds_configs"

# Headroom: the CUDA context, cuBLAS workspaces and NCCL buffers (1 GiB) come off the card,
# and only 90% of the rest is planned for (allocator fragmentation, transient peaks).
CUDA_CONTEXT_BYTES = 1 * GiB
GPU_USABLE_FRACTION = 0.90
CPU_USABLE_FRACTION = 0.90  # leave 10% of each node's RAM to the OS, page cache, data loader

# Time model (for ranking only; override on the command line).
DEFAULT_NETWORK_GBPS = 100.0  # inter-node, per node (100 Gbit Ethernet / EDR InfiniBand)
DEFAULT_INTRA_NODE_GBPS = 800.0  # per GPU, NVLink class; a PCIe-only server gets ~150
DEFAULT_PCIE_GBPS = 128.0  # GPU <-> CPU, per GPU (PCIe 4.0 x16, effective)
DEFAULT_GPU_TFLOPS = {"bf16": 100.0, "fp16": 100.0, "fp32": 25.0}  # achieved, per GPU
CPU_ADAM_PARAMS_PER_S = 2e9  # DeepSpeedCPUAdam, per node
RECOMPUTE_FACTOR = 4 / 3  # activation checkpointing re-runs the forward: 8 instead of 6 FLOPs


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
