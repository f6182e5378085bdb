"""The processes of a run: which rank this one is, the process group, and whether another
process is still there.

DeepSpeed owns the process group (NCCL/RCCL on GPUs, gloo on CPU); rank/world, rank-0 printing,
all-reduce of Python numbers and teardown are thin conveniences over `deepspeed.comm` /
`torch.distributed` so the rest of the code never checks `is_initialized`. Ranks started by
mpirun or srun get RANK/WORLD_SIZE from their launcher's variables (`adopt_launcher_world`);
`pid_alive`, `command_line` and `parent_pid` say whether a process (a lock's owner, the
launcher of this rank) still runs.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import torch
import torch.distributed as tdist

from gpt_ds.base import logs
from gpt_ds.base.errors import GptDsError

# Is a process still there? For leftovers named after the process that made them (a
# `.train.bin.PID.tmp` of a killed prepare_data, an export's `.OUT.tmp-PID`, an out dir's lock):
# only a dead process's leftovers may be removed, never those of a run still writing.


def pid_alive(pid: str | int) -> bool:
    """False only when no process `pid` exists on this machine; True when unsure."""
    try:
        os.kill(int(pid), 0)
    except ValueError:
        return True  # not a pid: not our naming, leave it alone
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of `/proc/PID/stat` (index 0 is field 3, the state), None when the
    process is gone. Field 2, the command, may hold spaces: split after its closing ')'."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat.rsplit(")", 1)[1].split()


def process_identity(pid: int) -> str | None:
    """`BOOT_ID:START_TICKS` of a live process of this machine, None when there is no such
    process. A pid reused by another process, or a reboot, gives another identity."""
    fields = _stat_fields(pid)
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return None if fields is None else f"{boot_id}:{fields[19]}"  # field 22: start time


def parent_pid(pid: int) -> int | None:
    """The parent of a live process of this machine (None when it is gone)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])  # field 4: ppid


def command_line(pid: int) -> str:
    """A live process's command line, arguments joined by spaces ('' when it is gone)."""
    try:
        raw = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


# Which rank this process is, for processes started by mpirun or srun.
#
# DeepSpeed's OpenMPI, MVAPICH and Slurm runners start every rank directly and set none of
# torch.distributed's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*): read from their
# launcher's own variables here, before the run is planned (train.main), every such process
# would be rank 0 of a world of one. `launcher_world` is a pure function of the environment.


class LauncherWorldError(GptDsError):
    """A launcher's rank variables are incomplete or contradict each other or the run's."""


# (launcher, rank, world size, local rank, local world size): the variables each launcher sets
# in every process it starts. The first whose world size is present wins: the innermost launcher
# comes first, so mpirun inside a Slurm batch job (whose SLURM_* the ranks inherit) is OpenMPI.
LAUNCHER_VARIABLES: tuple[tuple[str, str, str, str, str | None], ...] = (
    ("OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MVAPICH", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PMI (MPICH / Intel MPI / MVAPICH hydra)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
     "MPI_LOCALNRANKS"),
    # SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: only srun sets it; an sbatch script itself has
    # SLURM_PROCID=0 and SLURM_NTASKS=N and is one process, not rank 0 of N
    ("Slurm srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", None),
)  # fmt: skip
_MASTER_HINT = (
    "launch with launchers/openmpi.sh or launchers/multi_node.sh (they write both into "
    ".deepspeed_env), or give every rank both (mpirun -x MASTER_ADDR=<rank 0's host> "
    "-x MASTER_PORT=29500; srun --export=ALL,MASTER_ADDR=...,MASTER_PORT=...)"
)


def launcher_world(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE for a process started by mpirun or
    srun, read from that launcher's own variables in `env`.

    DeepSpeed's OpenMPI, MVAPICH and Slurm runners set none of the torch.distributed variables,
    and `init` would make every such process rank 0 of a world of one. Empty when RANK is
    already set (deepspeed, torchrun, the MPICH/Intel MPI runners), when no launcher variables
    are present, and for a world of one (`init` handles that as `python train.py`). Raises
    LauncherWorldError when the variables are incomplete or inconsistent, or when a world of
    several lacks MASTER_ADDR/MASTER_PORT (no launcher sets those).
    """
    if "RANK" in env:
        return {}
    incomplete = []
    for name, rank_var, size_var, local_var, local_size_var in LAUNCHER_VARIABLES:
        if size_var not in env:
            continue
        missing = [v for v in (rank_var, local_var) if v not in env]
        if missing:  # e.g. srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE only: Slurm's own come next
            incomplete.append(f"{name} sets {size_var} but not {' or '.join(missing)}")
            continue
        world = _read_world(env, name, rank_var, size_var, local_var, local_size_var)
        return _checked_against_env(env, name, world)
    if incomplete:
        raise LauncherWorldError(
            f"launcher variables are incomplete ({'; '.join(incomplete)}): start the ranks "
            "with the launcher itself (mpirun, srun), or set RANK, WORLD_SIZE, LOCAL_RANK, "
            "MASTER_ADDR and MASTER_PORT yourself"
        )
    return {}


def _read_world(
    env: Mapping[str, str],
    name: str,
    rank_var: str,
    size_var: str,
    local_var: str,
    local_size_var: str | None,
) -> dict[str, str]:
    """One launcher's variables as torch.distributed's, each checked against the others."""
    rank, size, local = (_whole(env, v) for v in (rank_var, size_var, local_var))
    if local_size_var is not None:
        local_size = _whole(env, local_size_var) if local_size_var in env else None
    else:
        local_size = _slurm_local_size(env)
    if size < 1 or rank >= size or local >= size:
        raise LauncherWorldError(
            f"{name}: rank {rank} (local {local}) of a world of {size} "
            f"({rank_var}, {local_var}, {size_var}): these cannot all hold"
        )
    if local_size is not None and not local < local_size <= size:
        raise LauncherWorldError(
            f"{name}: local rank {local} of {local_size} on this node, world {size} "
            f"({local_var}, {local_size_var or 'SLURM_STEP_TASKS_PER_NODE'})"
        )
    world = {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local)}
    if local_size is not None:
        world["LOCAL_WORLD_SIZE"] = str(local_size)
    return world


def _whole(env: Mapping[str, str], var: str) -> int:
    """A launcher variable as a whole number >= 0, or an error naming it."""
    value = env[var].strip()
    if not value.isdigit():
        raise LauncherWorldError(f"{var}={env[var]!r} is not a whole number")
    return int(value)


def _slurm_local_size(env: Mapping[str, str]) -> int | None:
    """Tasks of this step on this node: SLURM_STEP_TASKS_PER_NODE ("2(x3),1") at SLURM_NODEID."""
    counts: list[int] = []
    for part in env.get("SLURM_STEP_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            return None  # absent or a format this does not know: leave the local size unset
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = env.get("SLURM_NODEID", "")
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else None


def _checked_against_env(
    env: Mapping[str, str], name: str, world: dict[str, str]
) -> dict[str, str]:
    """`world`, unless it contradicts variables already set; {} for a world of one."""
    for var in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if var in env and var in world and env[var] != world[var]:
            raise LauncherWorldError(
                f"{var}={env[var]} is set but {name} says {world[var]}: unset {var} (the "
                "launcher's own variables give the world), or set RANK as well"
            )
    if world["WORLD_SIZE"] == "1":
        return {}
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env.get(v)]
    if missing:
        raise LauncherWorldError(
            f"{name} started rank {world['RANK']} of {world['WORLD_SIZE']} but "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set on it "
            f"(no launcher sets them): {_MASTER_HINT}"
        )
    return world


def adopt_launcher_world(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set this process's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE from mpirun's or srun's
    variables (see `launcher_world`); returns what it set.

    Called first thing in train.main: the run is planned from WORLD_SIZE on every rank before
    the process group exists, and `init` needs RANK to join the launcher's world.
    """
    world = launcher_world(environ)
    environ.update(world)
    return world


def init() -> None:
    """Join the process group the launcher set up (or a one-process group for `python train.py`)."""
    import deepspeed

    if "RANK" not in os.environ:  # plain `python gpt_ds/train.py`: be a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    logs.quiet_libraries()  # DeepSpeed set its logger's level when imported
    deepspeed.init_distributed(dist_init_required=True)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank())


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


def shm_buffer_paths() -> list[Path]:
    """This rank's DeepSpeed CPU all-reduce buffer in /dev/shm (the comm op never unlinks it).

    Name, from deepspeed/ops/csrc/cpu/comm/shm.cpp:
    deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>.
    """
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port or not Path("/dev/shm").is_dir():
        return []
    name = f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank()}"
    return [p for p in [Path("/dev/shm") / name] if p.exists()]


def shutdown() -> None:
    """Leave the process group cleanly and free this run's shared memory.

    Without an explicit destroy, ZeRO-3 ranks occasionally abort at interpreter exit; without
    the unlink, every CPU launch leaks ~130 MB of RAM in /dev/shm.
    """
    try:
        if tdist.is_initialized():
            tdist.destroy_process_group()
    except Exception as exc:  # teardown must not mask the run's own outcome
        logs.whole_line(f"[rank {rank()}] warning: destroy_process_group failed: {exc}", sys.stderr)
    for path in shm_buffer_paths():
        path.unlink(missing_ok=True)


def allreduce_send_rate(nbytes: int = 16 << 20, repeats: int = 3) -> float | None:
    """Bytes per second each rank sends in a ring all-reduce, measured on the live group.

    A start-up probe (a fraction of a second) that turns the model's bytes-per-step into an
    expected communication time; None for a world of one.
    """
    import time

    n = world_size()
    if n <= 1:
        return None
    t = torch.zeros(nbytes // 4, dtype=torch.float32, device=device())
    tdist.all_reduce(t)  # warm-up (connection set-up, buffers)
    barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        tdist.all_reduce(t)
    if t.is_cuda:
        torch.cuda.synchronize()
    elapsed = all_reduce_sum([time.perf_counter() - start])[0] / n
    return 2 * (n - 1) / n * nbytes * repeats / max(elapsed, 1e-9)
