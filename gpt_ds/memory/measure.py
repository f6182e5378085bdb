"""What a live DeepSpeed engine holds: model-state bytes read from DeepSpeed 0.19's internals."""

from __future__ import annotations

from typing import Any


def measured_model_state_bytes(engine) -> dict[str, int]:
    """Bytes of parameter, gradient and optimizer-state tensors this rank holds right now.

    Counts each storage once, whole (a view keeps all of its storage alive), wherever it lives
    (GPU, or CPU under offload). Call it after backward for the gradient buffers, or from inside
    the optimizer step for the fp32 step gradient; before the first step Adam has no state yet.
    Keys: params, grads, optimizer_states, total.
    """
    import torch

    seen: set[int] = set()
    out = {"params": 0, "grads": 0, "optimizer_states": 0}

    def add(cat: str, obj: Any) -> None:
        if obj is None:
            return
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "meta" or obj.numel() == 0:
                return
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key and key not in seen:
                seen.add(key)
                out[cat] += storage.nbytes()
            return
        if isinstance(obj, dict):
            obj = list(obj.values())
        if isinstance(obj, (list, tuple)):
            for item in obj:
                add(cat, item)

    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None) or opt
    # Weights: ZeRO-1/2 flat 16-bit buffer; ZeRO-3 partitions; FP16_Optimizer; the module.
    for name in (
        "bit16_groups_flat",
        "fp16_partitioned_groups_flat",
        "lp_param_buffer",
        "fp16_groups_flat",
    ):
        add("params", getattr(opt, name, None))
    for p in engine.module.parameters():
        add("params", p.data)
        add("params", getattr(p, "ds_tensor", None))
    # Optimizer states: fp32 master copies, then the inner optimizer's state (m, v, step).
    masters = []
    for name in (
        "single_partition_of_fp32_groups",
        "fp32_partitioned_groups_flat",
        "fp32_groups_flat",
        "fp32_groups",
    ):
        masters += list(getattr(opt, name, None) or [])
    add("optimizer_states", masters)
    add("optimizer_states", [s for s in getattr(inner, "state", {}).values()])
    # Gradients: DeepSpeed's buffers, the fp32 step gradients, the module's own .grad.
    for name in (
        "grads_in_partition",
        "grad_partitions_flat_buffer",
        "averaged_gradients",
        "all_grad_tensors",
    ):
        add("grads", getattr(opt, name, None))
    for m in masters:
        add("grads", getattr(m, "grad", None))
    for p in engine.module.parameters():
        add("grads", p.grad)
        add("grads", getattr(p, "grad_accum", None))
    for group in getattr(opt, "fp16_groups", None) or []:
        for p in group if isinstance(group, (list, tuple)) else []:
            add("grads", p.grad)
    out["total"] = sum(out.values())
    return out
