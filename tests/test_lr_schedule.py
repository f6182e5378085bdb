"""`--lr_schedule`: each schedule's learning rate, step by step, against its formula.

cosine / linear / constant: the scheduler section the flag writes, filled by the resolver as a
run fills it, built the way DeepSpeed builds a configured scheduler. wsd (gpt_ds's own
LambdaLR): the factor alone, then a real run's logged lr and its exact resume.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from deepspeed.runtime import lr_schedules
from harness.launch import run_python
from helpers.logged import train_losses, train_lrs
from helpers.machine import here
from support.launch import TRAIN, tiny_run_args

from gpt_ds.dsconfig.optimization import with_schedule, wsd_factor
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.dsconfig.settings import RunSettings

LR, MIN_LR, WARMUP, TOTAL = 1e-3, 1e-4, 4, 20


def warm(s: int) -> float:
    return LR * s / WARMUP


# the lr DeepSpeed's scheduler holds after s + 1 steps (its index s; what the run logs at
# iteration s + 1): warmup s/W, then the decay, whose progress counts from step W - 1
FORMULAS = {
    "cosine": lambda s: (
        warm(s)
        if s < WARMUP
        else MIN_LR
        + (LR - MIN_LR) * (1 + math.cos(math.pi * min(1, (s - WARMUP + 1) / (TOTAL - WARMUP)))) / 2
    ),
    "linear": lambda s: warm(s) if s < WARMUP else LR * max(0, TOTAL - s) / (TOTAL - WARMUP),
    "constant": lambda s: warm(s) if s < WARMUP else LR,
}


def deepspeed_lrs(schedule: str, steps: int) -> list[float]:
    """The lr after each of `steps` optimizer steps under `--lr_schedule schedule`."""
    raw = with_schedule(load_ds_config(preset_path("ds_configs/zero2.json")), schedule)
    min_lr = None if schedule in ("linear", "constant") else MIN_LR  # linear: to 0
    settings = RunSettings(
        world_size=1, decay_iters=TOTAL, lr=LR, min_lr=min_lr, warmup_iters=WARMUP
    )
    section = resolve_ds_config(raw, settings, source="test", facts=here()).config["scheduler"]
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = getattr(lr_schedules, section["type"])(optimizer, **section["params"])
    lrs = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()  # as the engine does after each optimizer step
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


@pytest.mark.parametrize("schedule", sorted(FORMULAS))
def test_deepspeed_schedules_follow_their_formula(schedule):
    lrs = deepspeed_lrs(schedule, TOTAL + 3)  # past the end: stays at the floor
    assert lrs == pytest.approx([FORMULAS[schedule](s) for s in range(TOTAL + 3)], abs=1e-12)


def test_wsd_warms_up_holds_and_decays_over_its_last_fraction():
    f = wsd_factor(warmup=4, total=20, decay=5, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert all(f(s) == 1.0 for s in range(4, 16))
    assert [f(s) for s in range(16, 23)] == pytest.approx([0.82, 0.64, 0.46, 0.28, 0.1, 0.1, 0.1])


@pytest.mark.slow
def test_a_wsd_run_logs_its_formula_and_resumes_exactly(shakespeare_dir, tmp_path):
    """10 steps: warmup 2, constant, the last 3 (0.3) decaying to lr/10; then steps 6-10 again
    from its iter_5 checkpoint (the LambdaLR's step comes back with DeepSpeed's checkpoint)."""
    out = tmp_path / "run"
    flags = dict(
        lr_schedule="wsd", wsd_decay_fraction=0.3, max_iters=10, warmup_iters=2, lr=2e-3,
        eval_interval=5, eval_iters=1,
    )  # fmt: skip
    stdout = run_python([str(TRAIN), *tiny_run_args(shakespeare_dir, out, **flags)]).stdout
    assert "lr: warmup-stable-decay (--lr_schedule wsd)" in stdout
    factor = wsd_factor(warmup=2, total=10, decay=3, min_ratio=0.1)
    logged = train_lrs(out)
    # torch's LambdaLR: step i used factor(i - 1); the log shows the lr after it, factor(i)
    assert logged == {i: pytest.approx(2e-3 * factor(i)) for i in range(1, 11)}

    again = tmp_path / "again"
    shutil.copytree(out, again)
    run_python([str(TRAIN), *tiny_run_args(shakespeare_dir, again, **flags, resume="iter_5")])
    assert {i: train_lrs(again)[i] for i in range(6, 11)} == {i: logged[i] for i in range(6, 11)}
    assert {i: train_losses(again)[i] for i in range(6, 11)} == {
        i: train_losses(out)[i] for i in range(6, 11)
    }
