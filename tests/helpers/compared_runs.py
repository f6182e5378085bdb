"""Short 2-rank training runs that tests compare with each other (gradient accumulation against
a larger micro-batch, activation checkpointing against none): each configuration is launched
once per test session, whichever test module (and worker) asks first, and shared read-only.

Every run: a 2-layer, 64-wide GPT-2, block 64, fp32, dropout 0, 4 optimizer steps at a real
learning rate (6e-3 from the first step), evaluations and checkpoints at steps 2 and 4
(`iter_2`, `final`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from harness.launch import run_deepspeed
from support.launch import tiny_run_args
from support.runs import consolidated_model

from helpers.logged import train_losses
from helpers.shared import made_once

ITERS = 4
BASE = {
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 64,
    "block_size": 64,
    "max_iters": ITERS,
    "lr": 6e-3,
    "warmup_iters": 0,
    "lr_decay_iters": 100,  # a near-constant, real learning rate from the first step
    "eval_interval": 2,
    "eval_iters": 2,
    "dropout": 0.0,
}
# the baseline most comparisons share: one micro-batch of 8 per step, 16 evaluation windows
WHOLE = {"micro_batch_size": 8, "grad_accum": 1, "eval_iters": 2}


def compared_run(data_dir: Path, root: Path, stage: int, **overrides) -> tuple[Path, str]:
    """(out_dir, stdout) of the run of BASE + `overrides` under ds_configs/zero{stage}.json,
    launched on first use in the session (under `root`: helpers.shared.shared_folder)."""
    name = f"zero{stage}_" + "_".join(f"{k}-{v}" for k, v in sorted(overrides.items()))
    config = {**BASE, "deepspeed_config": f"ds_configs/zero{stage}.json", **overrides}

    def launch(out: Path) -> str:
        return run_deepspeed(tiny_run_args(data_dir, out, **config)).stdout

    out = root / name
    return out, made_once(out, launch)


def assert_losses_close(out_a: Path, out_b: Path, rel: float = 1e-5) -> dict[int, float]:
    """Every logged training loss of the two runs equal to `rel`; returns run a's."""
    a, b = train_losses(out_a), train_losses(out_b)
    assert sorted(a) == sorted(b) == list(range(1, ITERS + 1)), (a, b)
    for it in a:
        assert math.isclose(a[it], b[it], rel_tol=rel), (it, a[it], b[it])
    return a


def assert_weights_close(out_a: Path, out_b: Path, tag: str = "final") -> float:
    """The consolidated fp32 weights of `tag` equal to float rounding; returns the largest
    difference (for the assertion messages of the caller)."""
    wa = consolidated_model(out_a, tag).state_dict()
    wb = consolidated_model(out_b, tag).state_dict()
    assert wa.keys() == wb.keys()
    worst = 0.0
    for name in wa:
        torch.testing.assert_close(
            wa[name], wb[name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )
        worst = max(worst, (wa[name] - wb[name]).abs().max().item())
    return worst
