"""The optimizer and LR-schedule sections of a DeepSpeed config: fill their "auto" from the run.

The learning rate, warmup and total steps come from the command line or gpt_ds's defaults. A
config written for the Hugging Face Trainer may leave more "auto" than gpt_ds's presets do; each
is filled the way transformers' `HfTrainerDeepSpeedConfig` fills it, with gpt_ds's values in
place of the Trainer's arguments:

- `optimizer.params.betas`, `eps`, `weight_decay`: gpt_ds's AdamW recipe (its presets' values),
  where the Trainer puts `--adam_beta1/2`, `--adam_epsilon`, `--weight_decay`;
- `scheduler.params.warmup_min_lr`: 0 (WarmupLR; WarmupDecayLR: `--min_lr` if given, else 0),
  `warmup_max_lr`: the lr, `warmup_num_steps` / `total_num_steps`: the run's steps.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, TypeGuard

from gpt_ds.dsconfig.optimizer import adam_facts, choose_adam
from gpt_ds.dsconfig.settings import RunSettings

DEFAULT_LR = 6e-4
DEFAULT_MIN_LR_FRACTION = 0.1  # min_lr = lr / 10, as in GPT-3 / nanoGPT
DEFAULT_MAX_WARMUP = 100  # warmup = min(100, max_iters // 10)
# gpt_ds's AdamW recipe (GPT-2/GPT-3), the values its presets set: fills "auto" at these keys.
ADAMW_DEFAULTS: dict[str, Any] = {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
_WARMUP_SCHEDULES = ("WarmupLR", "WarmupDecayLR")
# The keys of each DeepSpeed schedule that gpt_ds fills from the run: "auto" or left out (a
# left-out key would get DeepSpeed's own default, e.g. WarmupLR's warmup_max_lr 0.001 and
# 1000 warmup steps, while the run's log states the run's values).
_RUN_FILLED_KEYS: dict[str | None, tuple[str, ...]] = {
    "WarmupLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps"),
    "WarmupDecayLR": ("total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps"),
    "WarmupCosineLR": ("total_num_steps", "warmup_num_steps", "cos_min_ratio"),
}


class Filling(Protocol):
    """The resolution in progress (ds_config._Resolver): what these functions read and add to."""

    ds_config: dict
    run: RunSettings
    source: str
    problems: list[str]
    notes: list[str]

    def pick(self, key: str, cfg_value: Any, run_field: str, default: Any = None) -> tuple: ...


def is_set(value: Any) -> TypeGuard[Any]:
    """A concrete config value: present and not "auto" (any JSON value: not None for mypy)."""
    return value is not None and value != "auto"


def fill_optimizer_and_schedule(r: Filling) -> tuple[float, float, int]:
    """Fill the optimizer's and the scheduler's "auto"; returns (peak lr, final lr, warmup)."""
    optimizer = r.ds_config.get("optimizer")
    opt_params = optimizer.setdefault("params", {}) if optimizer is not None else {}
    scheduler = r.ds_config.get("scheduler")
    kind = scheduler["type"] if scheduler is not None else None
    params = scheduler.setdefault("params", {}) if scheduler is not None else {}

    lr, lr_from = _peak_lr(r, opt_params, kind, params)
    min_lr, min_lr_from, start_lr = _min_lr(r, kind, params, lr)
    default_warmup = max(1, min(DEFAULT_MAX_WARMUP, r.run.max_iters // 10))
    warmup, warmup_from = r.pick(
        "scheduler.params.warmup_num_steps",
        params.get("warmup_num_steps"),
        "warmup_iters",
        default_warmup,
    )
    total, _ = r.pick(
        "scheduler.params.total_num_steps", params.get("total_num_steps"), "max_iters"
    )
    if warmup == 0:
        warmup = 1
        r.notes.append("warmup: 0 given; DeepSpeed's warmup schedules need >= 1, using 1")
    if scheduler is not None and warmup > r.run.max_iters:
        r.problems.append(
            f"warmup_num_steps {warmup} ({warmup_from}) exceeds the run's {r.run.max_iters} "
            "steps (--max_iters): the learning rate would never reach its peak"
        )
    if min_lr > lr:
        r.problems.append(f"min lr {min_lr} ({min_lr_from}) is above lr {lr} ({lr_from})")

    if optimizer is not None:
        opt_params["lr"] = lr
        _adam_hyperparameters(r, optimizer["type"], opt_params)
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


def _peak_lr(r: Filling, opt_params: dict, kind: str | None, params: dict) -> tuple[float, str]:
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


def _min_lr(r: Filling, kind: str | None, params: dict, lr: float) -> tuple[float, str, float]:
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


def _adam_hyperparameters(r: Filling, kind: str, params: dict) -> None:
    """betas, eps, weight_decay left "auto" (HF Trainer configs): gpt_ds's AdamW recipe."""
    filled = [key for key in ADAMW_DEFAULTS if params.get(key) == "auto"]
    for key in filled:
        params[key] = list(ADAMW_DEFAULTS[key]) if key == "betas" else ADAMW_DEFAULTS[key]
    if filled:
        values = ", ".join(f"{key} {params[key]}" for key in filled)
        r.notes.append(f'optimizer: {kind} {values} (were "auto": gpt_ds\'s AdamW recipe)')


def _choose_adam(r: Filling, optimizer: dict) -> None:
    """Adam(W) becomes the implementation this machine can run (optimizer.py): torch's
    AdamW on CPU ranks and on GPUs where DeepSpeed's FusedAdam could not be built."""
    if optimizer.get("type", "").lower() not in ("adam", "adamw"):
        return
    offload = r.ds_config.get("zero_optimization", {}).get("offload_optimizer") or {}
    facts = adam_facts(offload=offload.get("device", "none") != "none")
    choice = choose_adam(facts, optimizer["params"])
    optimizer["params"].update(choice.params)
    r.notes.append(choice.note)
    r.problems.extend(choice.problems)
