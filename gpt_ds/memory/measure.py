"""What a live DeepSpeed engine holds: model-state bytes read from DeepSpeed 0.19's internals.

The attribute names below are DeepSpeed's (ZeRO-1/2 `stage_1_and_2.py`, ZeRO-3 `stage3.py`,
stage 0's `FP16_Optimizer` and `FP16_UnfusedOptimizer`); an attribute a stage does not have is
skipped. Categories are counted in order (weights, optimizer states, gradients), and a storage
already counted under one is not counted again under the next."""

from __future__ import annotations

from typing import Any

import torch

# Weights: ZeRO-1/2 flat 16-bit buffer; ZeRO-3 partitions; FP16_Optimizer.
_PARAM_BUFFERS = (
    "bit16_groups_flat",
    "fp16_partitioned_groups_flat",
    "lp_param_buffer",
    "fp16_groups_flat",
)
# fp32 master copies (their .grad is the fp32 step gradient).
_MASTER_WEIGHTS = (
    "single_partition_of_fp32_groups",
    "fp32_partitioned_groups_flat",
    "fp32_groups_flat",
    "fp32_groups",
)
# Reduced gradient buffers.
_GRAD_BUFFERS = (
    "grads_in_partition",
    "grad_partitions_flat_buffer",
    "averaged_gradients",
    "all_grad_tensors",
)


class _Storages:
    """Bytes per category, each storage counted once and whole, wherever it lives."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.bytes = {"params": 0, "grads": 0, "optimizer_states": 0}

    def add(self, cat: str, obj: Any) -> None:
        """Count a tensor, or every tensor in a (nested) list, tuple or dict; skip None."""
        if obj is None:
            return
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "meta" or obj.numel() == 0:
                return
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key and key not in self.seen:
                self.seen.add(key)
                self.bytes[cat] += storage.nbytes()
            return
        if isinstance(obj, dict):
            obj = list(obj.values())
        if isinstance(obj, (list, tuple)):
            for item in obj:
                self.add(cat, item)


def measured_model_state_bytes(engine) -> dict[str, int]:
    """Bytes of parameter, gradient and optimizer-state tensors this rank holds right now.

    Counts each storage once, whole (a view keeps all of its storage alive), wherever it lives
    (GPU, or CPU under offload). Call it after backward for the gradient buffers, or from inside
    the optimizer step for the fp32 step gradient; before the first step Adam has no state yet.
    Keys: params, grads, optimizer_states, total.
    """
    count = _Storages()
    opt = engine.optimizer
    _count_params(count, engine, opt)
    masters = _count_optimizer_states(count, opt)
    _count_grads(count, engine, opt, masters)
    out = dict(count.bytes)
    out["total"] = sum(out.values())
    return out


def _count_params(count: _Storages, engine, opt) -> None:
    """The optimizer's 16-bit weight buffers, then the module's parameters (ZeRO-3: partitions)."""
    for name in _PARAM_BUFFERS:
        count.add("params", getattr(opt, name, None))
    for p in engine.module.parameters():
        count.add("params", p.data)
        count.add("params", getattr(p, "ds_tensor", None))


def _count_optimizer_states(count: _Storages, opt) -> list:
    """fp32 master copies, then the inner optimizer's state (m, v, step; Muon's momentum and its
    working copies); returns the masters."""
    inner = getattr(opt, "optimizer", None) or opt
    masters: list[torch.Tensor] = []
    for name in _MASTER_WEIGHTS:  # FP16_UnfusedOptimizer's fp32_groups: a list per group
        for item in getattr(opt, name, None) or []:
            masters += item if isinstance(item, (list, tuple)) else [item]
    count.add("optimizer_states", masters)
    count.add("optimizer_states", [s for s in getattr(inner, "state", {}).values()])
    # Muon: ZeRO-1/2's staged momentum (beside its master, counted above), ZeRO-3's cached
    # all-gather buffers of whole matrices and momenta
    count.add("optimizer_states", getattr(opt, "_muon_pending_momentum", None))
    count.add("optimizer_states", getattr(opt, "_muon_allgather_buffers", None))
    return masters


def _count_grads(count: _Storages, engine, opt, masters: list) -> None:
    """DeepSpeed's gradient buffers, the fp32 step gradients, the module's own .grad."""
    for name in _GRAD_BUFFERS:
        count.add("grads", getattr(opt, name, None))
    for m in masters:
        count.add("grads", getattr(m, "grad", None))
    for p in engine.module.parameters():
        count.add("grads", p.grad)
        count.add("grads", getattr(p, "grad_accum", None))
    for group in getattr(opt, "fp16_groups", None) or []:
        for p in group if isinstance(group, (list, tuple)) else []:
            count.add("grads", p.grad)
