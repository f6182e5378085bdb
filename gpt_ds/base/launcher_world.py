"""Which rank this process is, for processes started by mpirun or srun.

DeepSpeed's OpenMPI, MVAPICH and Slurm runners start every rank directly and set none of
torch.distributed's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*): read from their
launcher's own variables here, before the run is planned (train.main), every such process
would be rank 0 of a world of one. `launcher_world` is a pure function of the environment;
`adopt_launcher_world` sets what it finds, for `dist.init` to join the launcher's world.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping

from gpt_ds.base.errors import GptDsError


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
    and `dist.init` would make every such process rank 0 of a world of one. Empty when RANK is
    already set (deepspeed, torchrun, the MPICH/Intel MPI runners), when no launcher variables
    are present, and for a world of one (`dist.init` handles that as `python train.py`). Raises
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
    the process group exists, and `dist.init` needs RANK to join the launcher's world.
    """
    world = launcher_world(environ)
    environ.update(world)
    return world
