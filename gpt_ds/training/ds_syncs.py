"""DeepSpeed's ZeRO-1/2 optimizer step without its host syncs (on a GPU each drains the queue).

DeepSpeed 0.19.8's stage_1_and_2.py makes, per optimizer step (Z = that file):
- per parameter group, `mask_nan_or_inf_with_val_inplace` (deepspeed/runtime/utils.py): a
  `torch.tensor(-1.0, device=...)` (a blocking host-to-device copy) used as `masked_fill_`'s
  value (an `.item()` in ATen);
- per parameter group, `unscale_and_clip_grads` (Z ~3193): `bool()` of "is the norm invalid";
- in `step` (Z ~3041), in fp32 only (no loss scaler): the same `bool()`, to skip a step with
  inf/NaN gradients.
The replacements compute the same values with tensor ops (a Python number as the fill value,
`torch.where` for the clip), and fp32 no longer skips a step by itself: as in bf16, gpt_ds
reads the gradient norm and the loss (training/step_results.py) and stops on a non-finite one
before any save. Installed for bf16 and fp32 when the optimizer checks no overflow (fp16 keeps
DeepSpeed's code: its loss scaler reads the overflow flag every step), and only on the
DeepSpeed versions in CHECKED; on any other DeepSpeed's own code runs, said at start-up.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch

CHECKED = ("0.19.8",)  # DeepSpeed versions whose stage_1_and_2.py these replacements match


def mask_invalid_norm(norm: torch.Tensor, device: Any = None, val: float = -1.0) -> None:
    """`mask_nan_or_inf_with_val_inplace` without a sync: an inf or NaN norm becomes -1, the
    sentinel DeepSpeed's own code writes (whatever `val` says) and later reads as invalid."""
    norm.masked_fill_(norm.isnan() | norm.isinf(), -1.0)


def unscale_and_clip_grads(self, grad_groups_flat: list, total_norm: Any) -> None:
    """DeepSpeedZeroOptimizer.unscale_and_clip_grads for a device norm: an invalid one (inf,
    NaN or the -1 sentinel) made inf by `torch.where`, not by a `bool()` of it, for the same
    scale. A Python number (no caller passes one) goes to DeepSpeed's own."""
    if not torch.is_tensor(total_norm):
        return type(self).unscale_and_clip_grads(self, grad_groups_flat, total_norm)
    if self.clip_grad == 0.0 and self.loss_scale == 1.0:
        return None
    combined_scale = self.loss_scale
    if self.clip_grad > 0.0:
        invalid = ~torch.isfinite(total_norm) | (total_norm < 0)
        clip_norm = torch.where(invalid, torch.full_like(total_norm, math.inf), total_norm)
        clip = torch.clamp((clip_norm / self.loss_scale + 1e-6) / self.clip_grad, min=1.0)
        combined_scale = clip * self.loss_scale
    for grad in grad_groups_flat:
        for g in grad if isinstance(grad, list) else [grad]:
            g.data.mul_(1.0 / combined_scale)
    return None


def invalid_norm_unread(norm: Any) -> bool:
    """`is_invalid_grad_norm` as `step` uses it in fp32: a device norm is not read (False), so
    the step is not skipped on it; the caller reads the norm later, with the loss."""
    if torch.is_tensor(norm):
        return False
    return not math.isfinite(float(norm)) or norm < 0


def sync_free_plan(
    zero_1_or_2: bool, precision: str, checks_overflow: bool, version: str
) -> tuple[bool, str]:
    """Whether to install the replacements, and the start-up line that says what runs."""
    if not zero_1_or_2:
        return False, ""  # ZeRO-3 or no ZeRO: its syncs are counted, not removed
    if precision == "fp16" or checks_overflow:
        return (
            False,
            "host syncs: DeepSpeed's step reads its overflow flag (fp16 or check_grad_overflow)",
        )
    if version not in CHECKED:
        return False, (
            f"host syncs: DeepSpeed {version}'s own ZeRO step runs, with its syncs (gpt_ds's "
            f"sync-free one is checked against {', '.join(CHECKED)} only)"
        )
    return True, "host syncs: DeepSpeed's ZeRO step without its per-group syncs (ds_syncs.py)"


def make_sync_free(engine: Any, precision: str) -> str:
    """Install the replacements for `engine`'s ZeRO-1/2 optimizer where they apply; returns
    the start-up line saying what runs."""
    import deepspeed
    from deepspeed.runtime.zero import stage_1_and_2

    optimizer: Any = getattr(engine, "optimizer", None)
    zero_1_or_2 = isinstance(optimizer, stage_1_and_2.DeepSpeedZeroOptimizer)
    checks = bool(getattr(optimizer, "check_grad_overflow", False))
    install, line = sync_free_plan(zero_1_or_2, precision, checks, deepspeed.__version__)
    if install:
        stage_1_and_2.mask_nan_or_inf_with_val_inplace = mask_invalid_norm
        stage_1_and_2.is_invalid_grad_norm = invalid_norm_unread
        optimizer.unscale_and_clip_grads = types.MethodType(unscale_and_clip_grads, optimizer)
    return line
