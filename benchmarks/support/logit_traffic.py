"""How often a loss walks over its logits: the operators that touch a logits-shaped tensor and
the bytes they stream, counted from what torch dispatches (exact on any machine).

A GPU runs the LM loss at memory speed: each pass over the fp32 logits (tokens x vocab x 4
bytes) costs about the same, so the passes a loss makes decide its time there. Counted per
dispatched operator, as a GPU launches it: a dense one reads each logits-shaped input and writes
each logits-shaped output in full; an indexing one (gather, index, index_put, scatter, the NLL
loss's forward) touches a row's worth, and counts as a launch with no pass. `logsumexp`, one
dispatch but four kernels (max, subtract, exp, sum), counts as its four.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch._refs  # AS_ON_A_GPU
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# operators that read or write a few elements a row of the tensors they are given
SPARSE = frozenset(
    ("gather", "index", "index_put", "index_put_", "_index_put_impl_", "scatter", "scatter_",
     "scatter_add", "scatter_add_", "index_select", "nll_loss_forward", "nll_loss2d_forward")
)  # fmt: skip

# operators torch dispatches as one but runs as several kernels, by what they run (ATen's
# logsumexp_out_impl: max, subtract, exp, sum, on every device)
AS_ON_A_GPU = {torch.ops.aten.logsumexp.default: torch._refs.logsumexp}
# allocations: no kernel, nothing streamed
ALLOCATIONS = frozenset(
    ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros_like")
)
# in-place operators that write their tensor without reading it
WRITE_ONLY = frozenset(("copy_", "fill_", "zero_"))


@dataclass
class LogitTraffic:
    """What a call did to its logits: kernel launches on them and fp32-equivalent passes."""

    rows: int  # tokens whose logits one pass covers
    vocab: int  # a logits-shaped tensor has a side this long or longer
    columns: int = 0  # the logits' width as seen (the vocabulary with any padding)
    launches: int = 0
    bytes: int = 0
    ops: list[str] = field(default_factory=list)

    @property
    def passes(self) -> float:
        """Bytes streamed over the logits, in passes over one fp32 (rows x vocab) tensor."""
        return self.bytes / (4 * self.rows * (self.columns or self.vocab))


class _Counter(TorchDispatchMode):
    def __init__(self, traffic: LogitTraffic, weight: torch.Tensor):
        super().__init__()
        self.traffic = traffic
        self.weight_storage = weight.untyped_storage().data_ptr()
        self.weight_shape = sorted(weight.shape)

    def _logits(self, tensors: list) -> list[torch.Tensor]:
        return [
            t
            for t in tensors
            if isinstance(t, torch.Tensor)
            and t.dim() == 2
            and max(t.shape) >= self.traffic.vocab  # (tokens, vocab) or its transpose
            and sorted(t.shape) != self.weight_shape  # the head weight, its gradient
            and t.untyped_storage().data_ptr() != self.weight_storage
        ]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in AS_ON_A_GPU:  # counted as the kernels it runs as there
            with self:
                return AS_ON_A_GPU[func](*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket.__name__ in ALLOCATIONS:
            return out
        inputs = self._logits(tree_flatten((args, kwargs))[0])
        outputs = self._logits(tree_flatten(out)[0])
        if not inputs and not outputs:
            return out
        name = func.overloadpacket.__name__
        self.traffic.columns = self.traffic.columns or max((inputs + outputs)[0].shape)
        self.traffic.launches += 1
        self.traffic.ops.append(name)
        if name not in SPARSE:
            written = {t.data_ptr() for t in outputs}
            in_place = name.endswith("_") and name not in WRITE_ONLY  # reads what it writes
            read = [t for t in inputs if t.data_ptr() not in written or in_place]
            self.traffic.bytes += sum(t.numel() * t.element_size() for t in read + outputs)
        return out


def logit_traffic(
    fn: Callable[..., torch.Tensor],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    vocab: int,
) -> LogitTraffic:
    """The logits traffic of `fn(hidden, weight, labels)` and of the backward of its result.
    A logits-shaped tensor is 2-D with a side of at least `vocab` and not the head weight's
    shape (reading the weight or writing its gradient is not a pass over the logits): a chunk of
    as many tokens as the weight's width would look like the weight, and go uncounted."""
    traffic = LogitTraffic(rows=hidden.shape[0], vocab=vocab)
    with _Counter(traffic, weight):
        loss = fn(hidden, weight, labels)
        if loss.requires_grad:
            loss.backward()
    return traffic
