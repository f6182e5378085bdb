"""What resolving a DeepSpeed config reads besides the config: the run's settings
(`RunSettings`: command-line values, their one check and their documented defaults; the length
flags, `LengthFlags`) and the facts of the machine it runs on (`MachineFacts`: probed once at
start by launch/machine.py `probe_machine`, or stated for a cluster the picker plans for).
dsconfig/resolve.py turns config + settings + facts into the resolved config, probing nothing;
the sections it hands to other modules (dsconfig/optimization.py, muon.py) see the resolution
as a `Resolution`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

PRECISIONS = ("bf16", "fp16", "fp32")  # what --precision names besides auto

# How long a run trains: `--max_iters`, or a budget in tokens (`--max_tokens`) or in passes over
# the train split (`--max_epochs`); dsconfig/resolve.py turns a budget into steps once the batch
# is resolved (`run_length`).
DEFAULT_MAX_ITERS = 200  # when no flag gives the run's length


class LengthFlags(Protocol):
    """The run config's length flags (run/config.py's RunConfig: frozen, so read-only)."""

    @property
    def max_iters(self) -> int | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def max_epochs(self) -> float | None: ...
    @property
    def lr_decay_iters(self) -> int | None: ...


def has_budget(cfg: LengthFlags) -> bool:
    """Whether the run's length is given in tokens or epochs rather than in steps."""
    return cfg.max_tokens is not None or cfg.max_epochs is not None


def steps_asked(cfg: LengthFlags) -> int:
    """The steps a run without a budget trains for: --max_iters, else the default."""
    return DEFAULT_MAX_ITERS if cfg.max_iters is None else cfg.max_iters


def decay_flag(cfg: LengthFlags) -> str:
    """The flag the schedule's span comes from: --lr_decay_iters, else the run's length flag."""
    if cfg.lr_decay_iters is not None:
        return "--lr_decay_iters"
    if cfg.max_tokens is not None:
        return "--max_tokens"
    return "--max_epochs" if cfg.max_epochs is not None else "--max_iters"


# `RunSettings`: what the run decides for the DeepSpeed config (command-line values and the
# launcher's world size), and the one check of those values. The run config (run/config.py)
# builds it; resolving a DeepSpeed config reads it.

# The command-line flag behind each RunSettings field, for messages ("... but --lr 3e-4 was given";
# the schedule's span names its own, `RunSettings.decay_from`).
CLI_FLAGS = {
    "micro_batch_size": "--micro_batch_size",
    "grad_accum": "--grad_accum",
    "lr": "--lr",
    "min_lr": "--min_lr",
    "warmup_iters": "--warmup_iters",
    "grad_clip": "--grad_clip",
    "precision": "--precision",
    "world_size": "world size",
    "muon_lr": "--muon_lr",
    "muon_momentum": "--muon_momentum",
    "muon_weight_decay": "--muon_weight_decay",
}

# (config key, RunSettings field) of each Muon setting a flag can give (dsconfig/muon.py fills
# them; a run without Muon refuses them)
MUON_KEYS = (
    ("muon_lr", "muon_lr"),
    ("momentum", "muon_momentum"),
    ("muon_weight_decay", "muon_weight_decay"),
)


@dataclass(kw_only=True)
class RunSettings:
    """What the run decides for the DeepSpeed config: command-line values and the launcher's world
    size. None means "not given": the config's concrete value, or a default, is used."""

    world_size: int
    """Data-parallel ranks (WORLD_SIZE from the launcher)."""
    micro_batch_size: int | None = None
    """Sequences per rank per forward/backward (train_micro_batch_size_per_gpu)."""
    grad_accum: int | None = None
    """Micro batches per optimizer step (gradient_accumulation_steps)."""
    lr: float | None = None
    """Peak learning rate (optimizer.params.lr)."""
    min_lr: float | None = None
    """Learning rate at the end of the cosine (scheduler cos_min_ratio = min_lr / lr)."""
    warmup_iters: int | None = None
    """Linear warmup steps (scheduler warmup_num_steps)."""
    decay_iters: int | None = None
    """Optimizer steps the schedule spans (scheduler total_num_steps), where no `length` is
    given (a tool resolving a config alone)."""
    length: LengthFlags | None = None
    """The run's length flags: its steps (and the schedule's span) follow from them once the
    batch is resolved (a budget in tokens or epochs needs it), over `train_tokens` tokens of
    `block_size`-token sequences."""
    block_size: int = 0
    train_tokens: int = 0
    grad_clip: float | None = None
    """Global gradient-norm clip (gradient_clipping); 0 disables it."""
    precision: str | None = None
    """None or "auto": detect from the hardware; "bf16", "fp16" or "fp32": forced."""
    hidden_size: int | None = None
    """The model's width (n_embd): ZeRO bucket sizes set to "auto" derive from it."""
    muon_lr: float | None = None
    """The Muon optimizer's lr for its half (optimizer.params.muon_lr)."""
    muon_momentum: float | None = None
    """The Muon half's momentum (optimizer.params.momentum)."""
    muon_weight_decay: float | None = None
    """The Muon half's weight decay (optimizer.params.muon_weight_decay, gpt_ds's key)."""
    decay_from: str = "--lr_decay_iters"
    """The flag the schedule's span comes from, for messages: --lr_decay_iters, or the one that
    gives the run's length (--max_iters, --max_tokens, --max_epochs)."""

    def flag(self, name: str) -> str:
        """The command-line flag behind field `name`, for messages."""
        return self.decay_from if name == "decay_iters" else CLI_FLAGS[name]

    def given(self, name: str) -> str:
        """Field `name`'s value as the user gave it: "--lr 0.001", or for a schedule spanning
        a budget in tokens or epochs, its steps and that flag ("10 steps (from --max_tokens)")."""
        value = getattr(self, name)
        if name == "decay_iters" and self.decay_from not in ("--lr_decay_iters", "--max_iters"):
            return f"{value} steps (from {self.decay_from})"
        return f"{self.flag(name)} {value}"

    def problems(self) -> list[str]:
        """Every out-of-range value, named by its command-line flag: the one check of the run's
        values that the DeepSpeed config depends on (config.validate uses it too)."""
        problems: list[str] = []

        def check(name: str, ok, what: str, optional: bool = True) -> None:
            value = getattr(self, name)
            if (value is None and optional) or (value is not None and ok(value)):
                return
            problems.append(f"{self.flag(name)} must be {what}, got {value!r}")

        def positive_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 1

        check("world_size", positive_int, "a positive integer", optional=False)
        check("decay_iters", positive_int, "a positive integer")
        check("micro_batch_size", positive_int, "a positive integer")
        check("grad_accum", positive_int, "a positive integer")
        check("warmup_iters", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
        check("lr", lambda v: v > 0, "> 0")
        check("min_lr", lambda v: v >= 0, ">= 0")
        check("grad_clip", lambda v: v >= 0, ">= 0 (0 disables clipping)")
        check("precision", lambda v: v in (*PRECISIONS, "auto"), "one of auto, bf16, fp16, fp32")
        check("muon_lr", lambda v: v > 0, "> 0")
        check("muon_momentum", lambda v: 0 <= v < 1, "in [0, 1)")
        check("muon_weight_decay", lambda v: v >= 0, ">= 0")
        return problems


DEFAULT_MICRO_BATCH = 4
DEFAULT_GRAD_ACCUM = 1
DEFAULT_GRAD_CLIP = 1.0
# gpt_ds's AdamW recipe (GPT-2/GPT-3), the values its presets set: fills "auto" at these keys
# (resolve.py), and the AdamW half of the section `--optimizer` writes (muon.py).
ADAMW_DEFAULTS: dict[str, Any] = {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
# What those flags default to, for the default column of docs/training.md's flag reference
# (tools/flag_reference.py): on the command line they are None, "not given", so that a concrete
# value in the DeepSpeed config wins (`ResolvedDsConfig.pick`).
_UNLESS_CONFIG = "unless the DeepSpeed config sets it"
_UNLESS_BATCH = f"{_UNLESS_CONFIG} or its train_batch_size implies another"
FLAG_DEFAULTS = {
    "micro_batch_size": f"`{DEFAULT_MICRO_BATCH}` ({_UNLESS_BATCH})",
    "grad_accum": f"`{DEFAULT_GRAD_ACCUM}` ({_UNLESS_BATCH})",
    "grad_clip": f"`{DEFAULT_GRAD_CLIP}` ({_UNLESS_CONFIG})",
}


@dataclass(frozen=True)
class AdamFacts:
    """What decides the implementation: the accelerator DeepSpeed uses ("cpu", "cuda", ...),
    whether it is ROCm, whether DeepSpeed's fused_adam op is prebuilt for it, and whether a
    compiler able to JIT-build it is present (`compiler` says which, for the report)."""

    accelerator: str
    rocm: bool = False
    prebuilt: bool = False
    compiler: str | None = None
    offload: bool = False
    compiler_blocked: str | None = None  # why the compiler cannot build the op, if it cannot


@dataclass(frozen=True, kw_only=True)
class MachineFacts:
    """The machine's side of every decision a run makes before it builds a model."""

    device_type: str
    """The accelerator DeepSpeed uses: "cpu", "cuda" (CUDA and ROCm), ..."""
    world_size: int
    """Data-parallel ranks, as the launcher set them (WORLD_SIZE)."""
    ranks_per_node: int
    """Ranks on this node (LOCAL_WORLD_SIZE): GPUs per node, or CPU ranks."""
    precision: tuple[str, str]
    """The precision this machine trains best ("bf16", "fp16", "fp32") and why."""
    fp16_refusal: str | None
    """Why fp16 cannot train here (with what to use instead), or None."""
    adam: AdamFacts
    """What decides the Adam(W) implementation (without optimizer offload)."""
    monitors: Mapping[str, str | None] = field(default_factory=dict)
    """Monitor package -> installed version, None where it is not installed."""
    device_bytes: int | None = None
    """This rank's GPU memory; None on CPU ranks (the guard then judges host RAM)."""
    device_name: str | None = None
    """The GPU's name as the driver reports it (the MFU peak is looked up by it); None on CPU."""
    compile_blocker: str | None = None
    """Why torch.compile's default backend cannot run here, or None."""
    host_ram: tuple[int, str] | None = None
    """The node's RAM as the kernel enforces it (bytes, and what sets it: the machine or its
    cgroup limit); None where the plan is for another machine."""
    wandb_mode: str = "online"
    """W&B's mode as it will read it from WANDB_MODE: online, offline or disabled."""
    wandb_key: bool = False
    """Whether W&B finds an API key (WANDB_API_KEY, or ~/.netrc's entry for its host)."""
    environ_names: frozenset[str] = frozenset()
    """The environment variables set at start, by name (never their values): the run's own
    settings for W&B and NCCL leave a user's alone."""

    @classmethod
    def gpu_cluster(cls, world_size: int, gpus_per_node: int, precision: str) -> MachineFacts:
        """A CUDA cluster the picker plans for (not the machine it runs on): `precision` as
        asked, DeepSpeed's FusedAdam, no monitors (the presets enable none)."""
        return cls(
            device_type="cuda",
            world_size=world_size,
            ranks_per_node=gpus_per_node,
            precision=(precision, f"the cluster planned for trains {precision}"),
            fp16_refusal=None,
            adam=AdamFacts(accelerator="cuda", prebuilt=True),
        )


def is_set(value: Any) -> TypeGuard[Any]:
    """A concrete config value: present and not "auto" (any JSON value: not None for mypy)."""
    return value is not None and value != "auto"


class Resolution(Protocol):
    """One resolution of a DeepSpeed config (resolve.py's), as the modules that fill a section
    of it see it: the config being filled, what it is filled from, and the problems and notes
    collected so far."""

    ds_config: dict
    run: RunSettings
    source: str
    facts: MachineFacts
    problems: list[str]
    notes: list[str]

    def pick(self, key: str, ds_value: Any, run_field: str, default: Any = None) -> Any:
        """(value, where it came from) for `key`: the config's if concrete, else the run's,
        else `default`; concrete in both and different is a problem."""
        ...
