"""gpt_ds/training/engine_build.py against DeepSpeed's own functions it replaces: the same values
on finite, inf, NaN and negative (the -1 sentinel) norms, with no host sync where DeepSpeed's
make one; which runs get it, said in one line. A real run's step is test_host_syncs'."""

from __future__ import annotations

import math
import types

import pytest
import torch
from deepspeed.runtime.utils import is_invalid_grad_norm, mask_nan_or_inf_with_val_inplace
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from torch.profiler import ProfilerActivity, profile

from gpt_ds.observe.host_syncs import SYNC_PREFIX, marking_syncs
from gpt_ds.observe.step_ops import LOCAL_SCALAR
from gpt_ds.training.engine_build import (
    CHECKED,
    invalid_norm_unread,
    mask_invalid_norm,
    sync_free_plan,
    unscale_and_clip_grads,
)

NORMS = [0.25, 3.0, math.inf, -math.inf, math.nan, -1.0]  # -1: DeepSpeed's "invalid" sentinel


def syncs_in(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof, marking_syncs():
        fn()
    names = [e.name for e in prof.events()]
    return sum(n == LOCAL_SCALAR or n.startswith(SYNC_PREFIX) for n in names)


@pytest.mark.parametrize("norm", NORMS)
def test_the_norm_mask_equals_deepspeeds_without_a_sync(norm):
    theirs, ours = torch.tensor(norm), torch.tensor(norm)
    assert syncs_in(lambda: mask_nan_or_inf_with_val_inplace(theirs, device="cpu")) >= 1
    assert syncs_in(lambda: mask_invalid_norm(ours, device="cpu")) == 0
    assert torch.equal(ours, theirs) and ours.dtype == theirs.dtype


def optimizer_state(clip_grad: float, loss_scale: float) -> types.SimpleNamespace:
    """What unscale_and_clip_grads reads of a DeepSpeedZeroOptimizer."""
    return types.SimpleNamespace(clip_grad=clip_grad, loss_scale=loss_scale, device="cpu")


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("clip_grad, loss_scale", [(1.0, 1.0), (0.5, 1.0), (1.0, 8.0), (0.0, 4.0)])
def test_the_clip_equals_deepspeeds_without_a_sync(norm, clip_grad, loss_scale):
    """Flat gradients and a list of sub-partitions, scaled by DeepSpeed's method and by ours:
    the same bits."""
    torch.manual_seed(0)
    grads = [torch.randn(10), [torch.randn(3), torch.randn(4)]]
    theirs = [grads[0].clone(), [g.clone() for g in grads[1]]]
    state = optimizer_state(clip_grad, loss_scale)
    total = torch.tensor(norm, dtype=torch.float32)
    made = syncs_in(lambda: DeepSpeedZeroOptimizer.unscale_and_clip_grads(state, theirs, total))
    assert made >= (1 if clip_grad > 0 else 0)
    assert syncs_in(lambda: unscale_and_clip_grads(state, grads, total)) == 0
    for ours, ref in zip([grads[0], *grads[1]], [theirs[0], *theirs[1]], strict=True):
        assert torch.equal(ours, ref) or (ours.isnan().all() and ref.isnan().all()), (ours, ref)


def test_the_step_check_reads_no_device_norm_and_judges_numbers_as_deepspeed():
    for norm in NORMS:
        assert invalid_norm_unread(norm) == is_invalid_grad_norm(norm)
        assert syncs_in(lambda n=norm: invalid_norm_unread(torch.tensor(n))) == 0
        assert invalid_norm_unread(torch.tensor(norm)) is False  # read later, with the loss


def test_which_runs_get_it_said_in_one_line():
    version = CHECKED[0]
    assert sync_free_plan(True, "bf16", False, version)[0]
    assert sync_free_plan(True, "fp32", False, version)[0]
    assert sync_free_plan(False, "bf16", False, version) == (False, "")  # ZeRO-3
    for precision, checks in (("fp16", True), ("bf16", True)):
        install, line = sync_free_plan(True, precision, checks, version)
        assert not install and "reads its overflow flag" in line
    install, line = sync_free_plan(True, "bf16", False, "0.20.0")
    assert not install
    assert line == (
        "host syncs: DeepSpeed 0.20.0's own ZeRO step runs, with its syncs (gpt_ds's sync-free "
        f"one is checked against {', '.join(CHECKED)} only)"
    )
