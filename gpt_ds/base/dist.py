"""The process group of a run: which rank this one is, and what the ranks do together.

DeepSpeed owns the process group (NCCL/RCCL on GPUs, gloo on CPU); rank/world, rank-0 printing,
all-reduce of Python numbers and teardown are thin conveniences over `deepspeed.comm` /
`torch.distributed` so the rest of the code never checks `is_initialized`. Ranks started by
mpirun or srun first take RANK/WORLD_SIZE from their launcher's variables (launcher_world.py).
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch
import torch.distributed as tdist

from gpt_ds.base import logs
from gpt_ds.base.errors import GptDsError


def init() -> None:
    """Join the process group the launcher set up (or a one-process group for `python train.py`)."""
    import deepspeed

    if "RANK" not in os.environ:  # plain `python gpt_ds/train.py`: be a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    logs.quiet_libraries()  # DeepSpeed set its logger's level when imported
    skip_cpu_shm_op()
    deepspeed.init_distributed(dist_init_required=True)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank())


def skip_cpu_shm_op() -> None:
    """Keep DeepSpeed's CPU backend from building and starting its shared-memory all-reduce.

    `init_distributed` on the CPU accelerator JIT-compiles that op (deepspeed/comm/torch.py
    `build_shm_op`) for `inference_all_reduce`, which only tensor-parallel inference calls:
    training reduces through the process group (gloo). Skipped, a first CPU launch needs no
    C++ compiler and no minute of compiling, and no rank leaves the ~66 MB /dev/shm buffer the
    op creates and never unlinks (a killed rank could not). DeepSpeed reads the op's
    availability from `deepspeed.ops.__compatible_ops__` there and nowhere else, with
    `.get(name, False)`: the entry is set without the probe that fills the rest on first access
    (a compiler run per op that needs a library, at every rank's start). GPU accelerators have
    no such op. Scripts that start DeepSpeed themselves (the benchmarks' peers) call it to run
    as gpt_ds's ranks do.
    """
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        import deepspeed.ops

        vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank() -> int:
    return tdist.get_rank() if tdist.is_initialized() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    return (
        tdist.get_world_size() if tdist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    )


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


# How long a rank that leaves the message to its node's local rank 0 waits before it exits.
# DeepSpeed's launcher polls its ranks about once a second and SIGKILLs the rest when one exits
# non-zero: a rank exiting at once could kill a slower-starting local rank 0 before it printed.
# Local rank 0's own exit ends the launch; the wait only matters where that never happens.
REFUSAL_WAIT_S = 20.0


def refuse(exc: GptDsError) -> int:
    """Exit 2 for a problem every rank finds alike (a flag, a file): each node's local rank 0
    says it once; the other ranks wait for it to, then exit too."""
    if local_rank() == 0:
        logs.whole_line(f"error: {exc}", sys.stderr)
    elif world_size() > 1:
        time.sleep(REFUSAL_WAIT_S)
    return 2


def local_world_size() -> int:
    """Ranks on this node (the launcher's LOCAL_SIZE / LOCAL_WORLD_SIZE; else the world)."""
    return int(os.environ.get("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", world_size())))


def is_main() -> bool:
    return rank() == 0


def print0(message: str) -> None:
    """Say `message` on global rank 0 only, as one whole line (the gpt_ds logger at INFO:
    `--log_level warning` quiets it)."""
    if is_main():
        logs.LOGGER.info(message)


def device() -> torch.device:
    """This rank's compute device: its GPU, or the CPU."""
    from deepspeed.accelerator import get_accelerator

    name = get_accelerator().device_name()
    return torch.device("cpu") if name == "cpu" else torch.device(name, local_rank())


def to_device(*tensors: torch.Tensor, dev: torch.device | None = None) -> list[torch.Tensor]:
    """Host tensors onto this rank's device; to a GPU from pinned memory without waiting (the
    copy overlaps the Python that follows; kernels on the same stream still see the data)."""
    dev = dev or device()
    if dev.type == "cpu":
        return list(tensors)
    return [t.pin_memory().to(dev, non_blocking=True) for t in tensors]


def barrier() -> None:
    if tdist.is_initialized():
        tdist.barrier()


def all_reduce_sum(
    values: list[float | torch.Tensor], dev: torch.device | None = None
) -> list[float]:
    """Sum a few float64 numbers across ranks (losses, token counts, flags); a value may be a
    0-d tensor still on the device, so the host waits only once, here."""
    dev = dev or device()
    t = torch.stack([torch.as_tensor(v, device=dev).to(torch.float64) for v in values])
    if tdist.is_initialized() and world_size() > 1:
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t.tolist()


def gather_objects(obj) -> list:
    """Every rank's `obj` (small and picklable: names, digests, messages), on every rank."""
    if not (tdist.is_initialized() and world_size() > 1):
        return [obj]
    out = [None] * world_size()
    tdist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank if it is true on any rank (so all ranks take the same branch)."""
    return all_reduce_sum([1.0 if flag else 0.0])[0] > 0


class DelayedAny:
    """Whether any rank raised each of a few flags, agreed on one step late so no rank waits for
    the answer: `vote(*flags)` starts this step's all-reduce and returns the previous step's
    outcome, which has long arrived (read through pinned memory and an event on a GPU: no
    drained queue). Every rank votes at the same points, so every rank gets the same answers.

    The flags travel as one number (a fill, one all-reduce): flag i counts (world size + 1)^i,
    so the sum over ranks holds each flag's count of ranks as one digit in base world size + 1.
    """

    def __init__(self, flags: int = 1) -> None:
        self.flags = flags
        self.pending: tuple | None = None  # (work, value on the host, copy's event or None)

    @property
    def lag(self) -> int:
        """Steps from a vote to its outcome: 1 across ranks, 0 in one process."""
        return 1 if tdist.is_initialized() and world_size() > 1 else 0

    def vote(self, *flags: bool) -> tuple[bool, ...]:
        """This step's flags in; the previous step's agreement out (all False the first time).
        One process: the flags themselves, at once."""
        assert len(flags) == self.flags, (flags, self.flags)
        if not self.lag:
            return tuple(bool(f) for f in flags)
        previous = self.settle()
        base = world_size() + 1
        packed = float(sum(base**i for i, f in enumerate(flags) if f))
        t = torch.full((1,), packed, dtype=torch.float64, device=device())  # a fill: no copy
        work = tdist.all_reduce(t, op=tdist.ReduceOp.SUM, async_op=True)
        if t.device.type == "cpu":
            self.pending = (work, t, None)
            return previous
        work.wait()  # a GPU stream waits for the all-reduce, the host does not
        host = torch.empty(1, dtype=torch.float64, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = torch.Event(t.device.type)
        event.record()
        self.pending = (None, host, event)
        return previous

    def settle(self) -> tuple[bool, ...]:
        """The outcome of the vote in flight now (all False if none); it is then over."""
        if self.pending is None:
            return (False,) * self.flags
        work, value, event = self.pending
        self.pending = None
        if work is not None:
            work.wait()
        if event is not None:
            event.synchronize()  # only as far as the copy, queued one step ago
        total, base = round(value.tolist()[0]), world_size() + 1
        return tuple((total // base**i) % base > 0 for i in range(self.flags))


def shutdown() -> None:
    """Leave the process group cleanly: without it, ZeRO-3 ranks occasionally abort at
    interpreter exit."""
    try:
        if tdist.is_initialized():
            tdist.destroy_process_group()
    except Exception as exc:  # teardown must not mask the run's own outcome
        logs.whole_line(f"[rank {rank()}] warning: destroy_process_group failed: {exc}", sys.stderr)
