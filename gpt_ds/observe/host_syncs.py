"""Host syncs made inside profiled steps, each named in the trace.

A GPU runs ahead of the host only while nothing asks for a device value: `.item()`, `bool()`,
`.tolist()`, `.cpu()`, a device synchronize... each waits for every kernel queued before it,
and the GPU then idles while the host launches the next ones. torch.profiler shows `.item()`
and `bool()` (`aten::_local_scalar_dense`) but not `.tolist()`, `.cpu()` or a synchronize;
`marking_syncs` wraps each such call in a `host_sync::<kind>` range so the trace holds them all,
in the phase that made them; also `torch.tensor(value, device=...)`, a blocking host-to-device
copy on a GPU (torch waits for the stream after a pageable copy). On CPU ranks the calls are
counted as a GPU would pay them.

What no CPU trace can show, because DeepSpeed does it only on GPUs (CPU_SKIPPED): ZeRO-1/2 with
`overlap_comm` on synchronizes the device at the end of every backward
(`independent_gradient_partition_epilogue`, skipped where the accelerator
`resolves_data_dependency()`, as the CPU accelerator does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.autograd.profiler import record_function

SYNC_PREFIX = "host_sync::"
TENSOR_TO_DEVICE = "tensor(device=)"  # the kind of a marked torch.tensor(..., device=...)
CPU_SKIPPED = (
    "device synchronize at the end of each backward: DeepSpeed's ZeRO-1/2 with overlap_comm on "
    "GPUs (gpt_ds's presets leave overlap_comm off on one rank)"
)
# Tensor methods that copy a device value to the host and so wait for the device
SYNC_METHODS = frozenset(
    {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy"}
)


def _to_host(args: tuple, kwargs: dict) -> bool:
    """Whether a `Tensor.to(...)` call copies a device tensor to the CPU (on CPU ranks, where
    "cpu" is the device itself, none does)."""
    if not isinstance(args[0], torch.Tensor) or args[0].device.type == "cpu":
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(str(t).startswith("cpu") for t in targets if isinstance(t, (str, torch.device)))


def _marked_method(name: str, method):
    """`method` (a Tensor method, or a device synchronize) run inside a `host_sync::<name>`
    range; a `.to` only when it copies a device tensor to the host."""

    def marked(*args, **kwargs):
        if name != "to" or _to_host(args, kwargs):
            with record_function(SYNC_PREFIX + name):
                return method(*args, **kwargs)
        return method(*args, **kwargs)

    return marked


def _marked_tensor(tensor):
    """`torch.tensor` inside a `host_sync::tensor(device=)` range when given a device."""

    def marked(*args, **kwargs):
        if kwargs.get("device") is None:
            return tensor(*args, **kwargs)
        with record_function(SYNC_PREFIX + TENSOR_TO_DEVICE):
            return tensor(*args, **kwargs)

    return marked


@contextlib.contextmanager
def marking_syncs() -> Iterator[None]:
    """Every host sync marked until the block ends: the Tensor methods of SYNC_METHODS and
    `.to` (as patched class attributes, not a TorchFunctionMode, whose push onto the mode stack
    fails a compiled model's guard and recompiles it inside the profiled steps),
    `torch.tensor(..., device=)`, and device synchronizes (torch.cuda's, DeepSpeed's
    accelerator's)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    cuda_sync, tensor = torch.cuda.synchronize, torch.tensor
    # on the instance only: deleting it below brings back the class's method
    accelerator.synchronize = _marked_method("synchronize", accelerator.synchronize)
    torch.cuda.synchronize = _marked_method("synchronize", cuda_sync)
    torch.tensor = _marked_tensor(tensor)
    for name in (*SYNC_METHODS, "to"):  # each defined on torch's C base class, not on Tensor
        setattr(torch.Tensor, name, _marked_method(name, getattr(torch.Tensor, name)))
    try:
        yield
    finally:
        for name in (*SYNC_METHODS, "to"):
            delattr(torch.Tensor, name)  # the base class's method again
        del accelerator.synchronize  # the class's method again
        torch.cuda.synchronize, torch.tensor = cuda_sync, tensor
