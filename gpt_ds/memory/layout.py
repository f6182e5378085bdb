"""Where GPT-2's parameters lie: the tensors in order, and ZeRO's partition of them per rank."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from gpt_ds.memory.settings import ZeroSettings
from gpt_ds.model.gpt2 import ModelShape


def parameter_layout(shape: ModelShape) -> list[tuple[str, int]]:
    """(name, elements) of GPT2LMHeadModel's parameters in `model.parameters()` order.

    lm_head.weight is tied to transformer.wte.weight and so appears once, as DeepSpeed sees it.
    """
    d, f = shape.n_embd, 4 * shape.n_embd
    out = [
        ("transformer.wte.weight", shape.vocab_size * d),
        ("transformer.wpe.weight", shape.block_size * d),
    ]
    for i in range(shape.n_layer):
        p = f"transformer.h.{i}."
        out += [
            (p + "ln_1.weight", d), (p + "ln_1.bias", d),
            (p + "attn.c_attn.weight", d * 3 * d), (p + "attn.c_attn.bias", 3 * d),
            (p + "attn.c_proj.weight", d * d), (p + "attn.c_proj.bias", d),
            (p + "ln_2.weight", d), (p + "ln_2.bias", d),
            (p + "mlp.c_fc.weight", d * f), (p + "mlp.c_fc.bias", f),
            (p + "mlp.c_proj.weight", f * d), (p + "mlp.c_proj.bias", d),
        ]  # fmt: skip
    return out + [("transformer.ln_f.weight", d), ("transformer.ln_f.bias", d)]


def largest_module_params(shape: ModelShape) -> int:
    """Elements of the module with the most parameters of its own (DeepSpeed's "largest layer")."""
    d = shape.n_embd
    return max(shape.vocab_size * d, shape.block_size * d, 4 * d * d + 4 * d, 3 * d * d + 3 * d)


@dataclass(frozen=True)
class Zero12Rank:
    """One rank's share of ZeRO-1/2's flat buffer, in elements."""

    partition: int  # elements of the flat buffer this rank owns (padded)
    overlap: int  # elements of the whole tensors that overlap that partition
    single_tensor: bool  # the partition lies inside one tensor


def zero12_ranks(sizes: list[int], world: int) -> list[Zero12Rank]:
    """DeepSpeed ZeRO-1/2's partitioning of the flat buffer (padded to 2*N), rank by rank."""
    total = sum(sizes)
    align = 2 * world  # nccl_start_alignment_factor x world size
    part = math.ceil(total / align) * align // world
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    ranks = []
    for r in range(world):
        lo, hi = r * part, min((r + 1) * part, total)
        if lo >= hi:
            ranks.append(Zero12Rank(partition=part, overlap=0, single_tensor=True))
            continue
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_left(starts, hi) - 1
        overlap = starts[last + 1] - starts[first]
        ranks.append(Zero12Rank(partition=part, overlap=overlap, single_tensor=first == last))
    return ranks


@dataclass(frozen=True)
class Zero3Layout:
    """One rank's ZeRO-3 parameter elements."""

    partition: int  # this rank's elements over all parameters (each padded to N)
    persistent: int  # elements of parameters kept whole on every rank


def zero3_layout(shape: ModelShape, world: int, settings: ZeroSettings) -> Zero3Layout:
    """DeepSpeed ZeRO-3's partition of every parameter (each padded to N) and its persistent
    parameters (the small ones, up to the model-wide cap), kept whole on every rank."""
    partition = persistent = 0
    for _, n in parameter_layout(shape):
        partition += math.ceil(n / world)
        within_model_cap = persistent + n <= settings.model_persistence_threshold
        if n <= settings.param_persistence_threshold and within_model_cap:
            persistent += n
    return Zero3Layout(partition=partition, persistent=persistent)
