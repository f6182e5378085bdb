"""How fast the live process group all-reduces: a start-up probe (a fraction of a second) whose
rate turns the memory model's bytes per step into an expected communication time (the start-up
report's `communication_plan`). Imported only by a run of several ranks."""

from __future__ import annotations

import time

import torch
import torch.distributed as tdist

from gpt_ds.base import dist


def allreduce_send_rate(nbytes: int = 16 << 20, repeats: int = 3) -> float:
    """Bytes per second each rank sends in a ring all-reduce, measured on the live group (of two
    ranks or more: every rank calls it)."""
    n = dist.world_size()
    t = torch.zeros(nbytes // 4, dtype=torch.float32, device=dist.device())
    tdist.all_reduce(t)  # warm-up (connection set-up, buffers)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        tdist.all_reduce(t)
    if t.is_cuda:
        torch.cuda.synchronize()
    elapsed = dist.all_reduce_sum([time.perf_counter() - start])[0] / n
    return 2 * (n - 1) / n * nbytes * repeats / max(elapsed, 1e-9)
