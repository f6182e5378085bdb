"""The optimizer and LR-schedule sections of a DeepSpeed config: `--lr_schedule`'s sections,
gpt_ds's warmup-stable-decay schedule, and every "auto" of both sections filled from the run
(`fill_optimizer_and_schedule`, called by resolve.py), and which Adam(W) implementation the
machine runs (`choose_adam`); Muon's own settings are muon.py's.

Which Adam: no run may die in `deepspeed.initialize` for want of a compiler. DeepSpeed turns
`"optimizer": {"type": "AdamW"}` into its FusedAdam on a CUDA/ROCm accelerator, and FusedAdam
JIT-compiles its kernel at construction unless DeepSpeed was installed with the op prebuilt
(deepspeed/runtime/engine.py `get_optimizer_configuration`, ops/op_builder/builder.py `load` /
`jit_load`). PyPI's torch wheels carry the CUDA runtime but no `nvcc`, so on a plain pip install
that build fails on every rank, after the model is built. `"torch_adam": true` makes DeepSpeed
use `torch.optim.AdamW`, whose `fused=True` kernel ships inside torch (CUDA, ROCm).
`choose_adam` is a pure function of what the machine has (`AdamFacts`, asked by
launch/machine.py `adam_facts`), tested for every branch.

`--lr_schedule`: the learning-rate schedule by name, each with a linear warmup. cosine, linear
and constant are DeepSpeed's own schedulers (WarmupCosineLR, WarmupDecayLR, WarmupLR): the flag
replaces the config's `scheduler` section with one whose values are all "auto", filled from the
run (--lr, --min_lr, --warmup_iters, --max_iters or --lr_decay_iters). DeepSpeed has no
warmup-stable-decay schedule: `wsd` is a torch `LambdaLR` handed to `deepspeed.initialize`
(whose checkpoints keep its step, so resume is exact): warmup to the peak, constant, then a
linear decay to --min_lr over the last `--wsd_decay_fraction` of the steps (Hu et al. 2024,
"MiniCPM"; the stable phase lets a run be extended or branched before its decay).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable

from gpt_ds.dsconfig.settings import ADAMW_DEFAULTS, MUON_KEYS, AdamFacts, Resolution, is_set

SCHEDULES = ("cosine", "linear", "constant", "wsd")
_DEEPSPEED_SECTIONS = {
    "cosine": {
        "type": "WarmupCosineLR",
        "params": {
            "total_num_steps": "auto",
            "warmup_num_steps": "auto",
            "warmup_min_ratio": 0,
            "cos_min_ratio": "auto",
            "warmup_type": "linear",
        },
    },
    "linear": {  # warms up from warmup_min_lr and decays back to it: --min_lr, default 0
        "type": "WarmupDecayLR",
        "params": {
            "total_num_steps": "auto",
            "warmup_num_steps": "auto",
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_type": "linear",
        },
    },
    "constant": {
        "type": "WarmupLR",
        "params": {
            "warmup_num_steps": "auto",
            "warmup_min_lr": 0,
            "warmup_max_lr": "auto",
            "warmup_type": "linear",
        },
    },
}


def with_schedule(ds_config: dict, schedule: str | None) -> dict:
    """`ds_config` with its scheduler section for `schedule` (None: the config's own; wsd:
    none, the trainer passes its LambdaLR)."""
    if schedule is None:
        return ds_config
    ds_config = copy.deepcopy(ds_config)
    ds_config.pop("scheduler", None)
    if schedule in _DEEPSPEED_SECTIONS:
        ds_config["scheduler"] = copy.deepcopy(_DEEPSPEED_SECTIONS[schedule])
    return ds_config


def wsd_factor(warmup: int, total: int, decay: int, min_ratio: float) -> Callable[[int], float]:
    """The multiplier of the peak lr after `step` optimizer steps (0 at the first step)."""
    decay_start = total - decay

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if step < decay_start:
            return 1.0
        left = max(0, total - step) / max(1, decay)
        return min_ratio + (1.0 - min_ratio) * left

    return factor


def wsd_scheduler(
    lr: float, min_lr: float, warmup: int, total: int, decay_fraction: float
) -> tuple[Callable, str]:
    """(the callable `deepspeed.initialize` builds the scheduler with, the log line)."""
    import torch

    decay = max(1, round(total * decay_fraction))
    factor = wsd_factor(warmup, total, decay, min_lr / lr)
    line = (
        f"lr: warmup-stable-decay (--lr_schedule wsd), linear warmup from 0 to {lr:g} over "
        f"{warmup} steps, constant to step {total - decay}, then linear down to {min_lr:g} at "
        f"step {total}"
    )
    return (lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)), line


# The optimizer and LR-schedule sections of a DeepSpeed config: fill their "auto" from the run.
#
# The learning rate, warmup and total steps come from the command line or gpt_ds's defaults. A
# config written for the Hugging Face Trainer may leave more "auto" than gpt_ds's presets do; each
# is filled the way transformers' `HfTrainerDeepSpeedConfig` fills it, with gpt_ds's values in
# place of the Trainer's arguments:
#
# - `optimizer.params.betas`, `eps`, `weight_decay`: gpt_ds's AdamW recipe (its presets' values),
#   where the Trainer puts `--adam_beta1/2`, `--adam_epsilon`, `--weight_decay`;
# - `scheduler.params.warmup_min_lr`: 0 (WarmupLR; WarmupDecayLR: `--min_lr` if given, else 0),
#   `warmup_max_lr`: the lr, `warmup_num_steps` / `total_num_steps`: the run's steps.

DEFAULT_LR = 6e-4
DEFAULT_MIN_LR_FRACTION = 0.1  # min_lr = lr / 10, as in GPT-3 / nanoGPT
DEFAULT_MAX_WARMUP = 100  # warmup = min(100, the schedule's span // 10)
_WARMUP_SCHEDULES = ("WarmupLR", "WarmupDecayLR")
# The keys of each DeepSpeed schedule that gpt_ds fills from the run: "auto" or left out (a
# left-out key would get DeepSpeed's own default, e.g. WarmupLR's warmup_max_lr 0.001 and
# 1000 warmup steps, while the run's log states the run's values).
_RUN_FILLED_KEYS: dict[str | None, tuple[str, ...]] = {
    "WarmupLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps"),
    "WarmupDecayLR": ("total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps"),
    "WarmupCosineLR": ("total_num_steps", "warmup_num_steps", "cos_min_ratio"),
}


def fill_optimizer_and_schedule(r: Resolution) -> tuple[float, float, int]:
    """Fill the optimizer's and the scheduler's "auto"; returns (peak lr, final lr, warmup)."""
    optimizer = r.ds_config.get("optimizer")
    opt_params = optimizer.setdefault("params", {}) if optimizer is not None else {}
    scheduler = r.ds_config.get("scheduler")
    kind = scheduler["type"] if scheduler is not None else None
    params = scheduler.setdefault("params", {}) if scheduler is not None else {}

    steps = r.run.decay_iters
    assert steps is not None, "RunSettings.decay_iters or .length gives the schedule's span"
    lr, lr_from = _peak_lr(r, opt_params, kind, params)
    min_lr, min_lr_from, start_lr = _min_lr(r, kind, params, lr)
    default_warmup = max(1, min(DEFAULT_MAX_WARMUP, steps // 10))
    warmup, warmup_from = r.pick(
        "scheduler.params.warmup_num_steps",
        params.get("warmup_num_steps"),
        "warmup_iters",
        default_warmup,
    )
    total, _ = r.pick(
        "scheduler.params.total_num_steps", params.get("total_num_steps"), "decay_iters"
    )
    if warmup == 0:
        warmup = 1
        r.notes.append("warmup: 0 given; DeepSpeed's warmup schedules need >= 1, using 1")
    if scheduler is not None and warmup > steps:
        r.problems.append(
            f"warmup_num_steps {warmup} ({warmup_from}) exceeds the {steps} steps the schedule "
            f"spans ({r.run.decay_from}): the learning rate would never reach its peak"
        )
    if min_lr > lr:
        r.problems.append(f"min lr {min_lr} ({min_lr_from}) is above lr {lr} ({lr_from})")

    if optimizer is not None:
        opt_params["lr"] = lr
        _adam_hyperparameters(r, optimizer["type"], opt_params)
        _muon_settings(r, optimizer, kind)
        _choose_adam(r, optimizer)
    else:
        r.notes.append("optimizer: none in the config; the trainer must pass one")
    fills = {
        "total_num_steps": total,
        "warmup_num_steps": warmup,
        "cos_min_ratio": min_lr / lr,
        "warmup_max_lr": lr,
        "warmup_min_lr": start_lr,
    }
    for key, value in fills.items():
        absent_and_ours = key not in params and key in _RUN_FILLED_KEYS.get(kind, ())
        if params.get(key) == "auto" or absent_and_ours:
            params[key] = value
    r.notes.append(
        _schedule_note(
            kind, (lr, lr_from), (min_lr, min_lr_from), start_lr, (warmup, warmup_from), params
        )
    )
    return lr, min_lr, warmup


def _peak_lr(r: Resolution, opt_params: dict, kind: str | None, params: dict) -> tuple[float, str]:
    """The optimizer's lr; DeepSpeed's warmup schedules overwrite it with warmup_max_lr, so a
    concrete warmup_max_lr counts as the config's lr and must agree with a concrete lr."""
    lr_cfg = opt_params.get("lr")
    if kind in _WARMUP_SCHEDULES:
        max_lr = params.get("warmup_max_lr")
        if is_set(lr_cfg) and is_set(max_lr) and not math.isclose(lr_cfg, max_lr, rel_tol=1e-9):
            r.problems.append(
                f"optimizer.params.lr is {lr_cfg} but scheduler.params.warmup_max_lr is "
                f"{max_lr} in {r.source}: {kind} sets the lr to warmup_max_lr; make them equal "
                '(or set one to "auto")'
            )
        elif not is_set(lr_cfg):
            lr_cfg = max_lr
    return r.pick("optimizer.params.lr", lr_cfg, "lr", DEFAULT_LR)


def _min_lr(r: Resolution, kind: str | None, params: dict, lr: float) -> tuple[float, str, float]:
    """(final lr, where it came from, lr at the start of warmup) for the schedule `kind`."""
    if kind == "WarmupLR":  # warmup from warmup_min_lr to lr, then constant: nothing decays
        if r.run.min_lr is not None:
            r.problems.append(
                f"--min_lr {r.run.min_lr} was given but scheduler.type WarmupLR in {r.source} "
                "keeps the lr constant after warmup; drop --min_lr, or use WarmupDecayLR or "
                "WarmupCosineLR"
            )
        start = params.get("warmup_min_lr")
        return lr, "WarmupLR: constant after warmup", start if is_set(start) else 0.0
    if kind == "WarmupDecayLR":  # linear decay from lr down to warmup_min_lr, its start too
        final, final_from = r.pick(
            "scheduler.params.warmup_min_lr", params.get("warmup_min_lr"), "min_lr", 0.0
        )
        return final, final_from, final
    ratio, run_min = params.get("cos_min_ratio"), r.run.min_lr
    if is_set(ratio):
        if run_min is not None and not math.isclose(ratio * lr, run_min, rel_tol=1e-6):
            r.problems.append(
                f"scheduler.params.cos_min_ratio is {ratio} in {r.source} (min lr "
                f"{ratio * lr:g} at lr {lr:g}) but --min_lr {run_min} was given; remove one "
                '(or set cos_min_ratio to "auto")'
            )
        return ratio * lr, f"cos_min_ratio {ratio} in {r.source}", 0.0
    if run_min is not None:
        return run_min, "--min_lr", 0.0
    return lr * DEFAULT_MIN_LR_FRACTION, "default lr/10", 0.0


def _schedule_note(
    kind: str | None,
    lr: tuple[float, str],
    final: tuple[float, str],
    start: float,
    warmup: tuple[int, str],
    params: dict,
) -> str:
    """The run log's line on the schedule: its shape, each value and where it came from."""
    (peak, peak_from), (min_lr, min_lr_from) = lr, final
    if kind is None:
        return f"lr: {peak:g} ({peak_from}), no scheduler in the config"
    steps = f"{warmup[0]} warmup steps ({warmup[1]})"
    if kind in _WARMUP_SCHEDULES:
        shape = f"{params.get('warmup_type', 'log')} warmup from {start:g}"
        end = (
            "then constant"
            if kind == "WarmupLR"
            else f"then linear down to {min_lr:g} ({min_lr_from}) at step "
            f"{params.get('total_num_steps')}"
        )
        return f"lr: {kind}, {shape} to {peak:g} ({peak_from}) over {steps}, {end}"
    return (
        f"lr: {kind}, peak {peak:g} ({peak_from}), {steps}, down to {min_lr:g} ({min_lr_from}) "
        f"at step {params.get('total_num_steps')}"
    )


def _adam_hyperparameters(r: Resolution, kind: str, params: dict) -> None:
    """betas, eps, weight_decay left "auto" (HF Trainer configs): gpt_ds's AdamW recipe."""
    filled = [key for key in ADAMW_DEFAULTS if params.get(key) == "auto"]
    for key in filled:
        params[key] = list(ADAMW_DEFAULTS[key]) if key == "betas" else ADAMW_DEFAULTS[key]
    if filled:
        values = ", ".join(f"{key} {params[key]}" for key in filled)
        r.notes.append(f'optimizer: {kind} {values} (were "auto": gpt_ds\'s AdamW recipe)')


def _muon_settings(r: Resolution, optimizer: dict, schedule: str | None) -> None:
    """A Muon section's own settings (muon.py); a Muon flag without Muon is a problem."""
    muon = optimizer_type(optimizer) == "muon"
    if muon or any(getattr(r.run, name) is not None for _, name in MUON_KEYS):
        from gpt_ds.dsconfig import muon as muon_setup  # only a Muon run (or a mistake) needs it

        if muon:
            muon_setup.fill_muon(r, optimizer["params"], schedule)
        else:
            muon_setup.flags_without_muon(r)


def optimizer_type(optimizer: dict | None) -> str | None:
    """An optimizer section's type, lower case ("adamw", "muon", ...); None without one."""
    kind = (optimizer or {}).get("type")
    return str(kind).lower() if kind else None


def steps_fused_adam(ds_config: dict) -> bool:
    """Whether DeepSpeed builds its FusedAdam for this config: Adam(W) without `torch_adam`,
    without optimizer offload (CPU Adam). At stage 0 in 16 bits any other optimizer is
    stepped by FP16_UnfusedOptimizer, an fp32 copy and step per tensor."""
    optimizer = ds_config.get("optimizer") or {}
    zero = ds_config.get("zero_optimization", {})
    offload = zero.get("offload_optimizer", {}).get("device", "none") != "none"
    torch_adam = optimizer.get("params", {}).get("torch_adam", False)
    return optimizer_type(optimizer) in ("adam", "adamw") and not torch_adam and not offload


def _choose_adam(r: Resolution, optimizer: dict) -> None:
    """Adam(W), and Muon's AdamW half, become the implementation this machine can run
    (`choose_adam`): torch's AdamW on CPU ranks and on GPUs where DeepSpeed's FusedAdam could
    not be built."""
    kind = optimizer_type(optimizer)
    if kind not in ("adam", "adamw", "muon"):
        return
    offload = r.ds_config.get("zero_optimization", {}).get("offload_optimizer") or {}
    facts = dataclasses.replace(r.facts.adam, offload=offload.get("device", "none") != "none")
    choice = choose_adam(facts, optimizer["params"])
    optimizer["params"].update(choice.params)
    half = "optimizer: Muon's AdamW half: " if kind == "muon" else "optimizer: "
    r.notes.append(half + choice.note.removeprefix("optimizer: "))
    r.problems.extend(choice.problems)


# ----------------------------------------------------------------------------------------------
# Which Adam(W) implementation

# Keys only DeepSpeed's FusedAdam takes: torch's AdamW raises TypeError on them.
FUSED_ADAM_ONLY_KEYS = ("bias_correction", "set_grad_none")


@dataclasses.dataclass
class AdamChoice:
    """The optimizer params to set (DeepSpeed config `optimizer.params`) and the report line."""

    params: dict = dataclasses.field(default_factory=dict)
    note: str = ""
    problems: list[str] = dataclasses.field(default_factory=list)


def choose_adam(facts: AdamFacts, params: dict) -> AdamChoice:
    """The Adam(W) implementation for a config whose optimizer params are `params` (not
    modified). A `torch_adam` the user set is kept; otherwise:

    - optimizer offload: DeepSpeed's CPU Adam (a C++ build, no GPU compiler needed);
    - CPU ranks: torch's AdamW (exact resume: it recomputes bias corrections; no compile);
    - GPU with the op prebuilt, or a compiler that can build it: DeepSpeed's FusedAdam;
    - GPU without either: torch's AdamW(fused=True), which needs no build;
    - other accelerators: DeepSpeed's own choice.
    """
    return _checked(_implementation(facts, params), params)


def _implementation(facts: AdamFacts, params: dict) -> AdamChoice:
    """`choose_adam`'s pick and its report line, before the params are checked."""
    if "torch_adam" in params:
        impl = "torch AdamW" if params["torch_adam"] else "DeepSpeed's Adam"
        return AdamChoice(note=f"optimizer: {impl} (torch_adam set in the config)")
    if facts.offload:
        return AdamChoice(note="optimizer: DeepSpeed CPU Adam (optimizer offload)")
    if facts.accelerator == "cpu":
        why = "CPU ranks: exact resume, no kernel compile"
        return AdamChoice({"torch_adam": True}, f"optimizer: torch AdamW ({why})")
    if facts.accelerator != "cuda":
        return AdamChoice(note=f"optimizer: DeepSpeed's choice on {facts.accelerator}")
    kind = "ROCm" if facts.rocm else "CUDA"
    if facts.prebuilt:
        return AdamChoice(note="optimizer: DeepSpeed FusedAdam (op prebuilt)")
    if facts.compiler and not facts.compiler_blocked:
        note = f"optimizer: DeepSpeed FusedAdam (JIT-built once with {facts.compiler})"
        return AdamChoice(note=note)
    compiler = "hipcc" if facts.rocm else "nvcc matching torch's CUDA version"
    why = f"no {compiler} to build DeepSpeed's FusedAdam on this {kind} machine"
    why += ", and it is not prebuilt"
    choice = {"torch_adam": True}
    if params.get("foreach") is None:  # torch refuses fused together with foreach
        choice["fused"] = True
    fused = "fused=True, " if "fused" in choice else ""
    note = f"optimizer: torch AdamW ({fused}built into torch): {facts.compiler_blocked or why}"
    return AdamChoice(choice, note)


def _checked(choice: AdamChoice, params: dict) -> AdamChoice:
    """Problems of the final params: keys the chosen implementation would raise TypeError on,
    and torch's refusal of `fused` together with `foreach`."""
    final = {**params, **choice.params}
    torch_adam = bool(final.get("torch_adam"))
    where = "optimizer.params"
    if torch_adam:
        for key in FUSED_ADAM_ONLY_KEYS:
            if key in final:
                choice.problems.append(
                    f"{where}.{key} is an option of DeepSpeed's FusedAdam, which this run does "
                    f"not use ({choice.note.removeprefix('optimizer: ')}): torch's AdamW "
                    f"always bias-corrects and sets gradients to None; remove {key}"
                )
        if final.get("fused") and final.get("foreach"):
            choice.problems.append(
                f"{where}.fused and {where}.foreach are both true: torch's AdamW takes one; "
                "remove foreach (fused is faster on GPUs)"
            )
    elif "fused" in final:
        choice.problems.append(
            f'{where}.fused is an option of torch\'s AdamW: add "torch_adam": true to use it, '
            "or remove fused"
        )
    return choice
