"""`--lr_schedule`: the learning-rate schedule by name, each with a linear warmup.

cosine, linear and constant are DeepSpeed's own schedulers (WarmupCosineLR, WarmupDecayLR,
WarmupLR): the flag replaces the config's `scheduler` section with one whose values are all
"auto", which resolve.py fills from the run (--lr, --min_lr, --warmup_iters, --max_iters or
--lr_decay_iters). DeepSpeed has no warmup-stable-decay schedule: `wsd` is a torch `LambdaLR`
handed to `deepspeed.initialize` (whose checkpoints keep its step, so resume is exact): warmup
to the peak, constant, then a linear decay to --min_lr over the last `--wsd_decay_fraction` of
the steps (Hu et al. 2024, "MiniCPM"; the stable phase lets a run be extended or branched
before its decay).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

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
