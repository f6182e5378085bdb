"""gpt_ds.base.launcher_world: ranks started by mpirun or srun (DeepSpeed's OpenMPI, MVAPICH and
Slurm runners set no RANK/WORLD_SIZE/MASTER_*) read their world from the launcher's variables.

Each variable set below is the one that launcher gives a rank (OpenMPI 4 mpirun, MVAPICH2
mpirun_rsh, MPICH/Intel MPI hydra, Slurm srun); the real OpenMPI run is tests/test_openmpi.py.
"""

from __future__ import annotations

import pytest
from helpers.messages import assert_names

from gpt_ds.base import dist
from gpt_ds.base.errors import GptDsError
from gpt_ds.base.launcher_world import (
    LAUNCHER_VARIABLES,
    LauncherWorldError,
    adopt_launcher_world,
    launcher_world,
)

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
}
MVAPICH = {
    "MV2_COMM_WORLD_RANK": "3",
    "MV2_COMM_WORLD_SIZE": "4",
    "MV2_COMM_WORLD_LOCAL_RANK": "1",
    "MV2_COMM_WORLD_LOCAL_SIZE": "2",
}
HYDRA = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
SRUN = {
    "SLURM_PROCID": "4",
    "SLURM_STEP_NUM_TASKS": "5",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
    "SLURM_NTASKS": "5",
}
# what an sbatch script (the batch step: one process) itself sees
SBATCH_SCRIPT = {
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NODEID": "0",
}

# every variable launcher_world reads
LAUNCHER_VARIABLE_NAMES = tuple(
    v for entry in LAUNCHER_VARIABLES for v in entry[1:] if v is not None
) + ("SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE")


def launched_by(monkeypatch, launcher_env: dict[str, str]) -> None:
    """os.environ as a rank of that launcher sees it, restored after the test (each name is set
    first so that monkeypatch restores it even where the test's code sets it, as adopt does)."""
    for name in (*LAUNCHER_VARIABLE_NAMES, "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # fmt: skip
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in launcher_env.items():
        monkeypatch.setenv(name, value)


def refusal(env: dict[str, str]) -> str:
    """The message of the LauncherWorldError `env` is refused with."""
    with pytest.raises(LauncherWorldError) as exc:
        launcher_world(env)
    return str(exc.value)


def world(rank: int, size: int, local: int, local_size: int | None) -> dict[str, str]:
    out = {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local)}
    if local_size is not None:
        out["LOCAL_WORLD_SIZE"] = str(local_size)
    return out


@pytest.mark.parametrize(
    "launcher_env,expected",
    [
        (OPENMPI, world(5, 8, 1, 4)),
        (MVAPICH, world(3, 4, 1, 2)),
        (HYDRA, world(2, 4, 0, 2)),
        (SRUN, world(4, 5, 0, 1)),
        (
            {
                **SRUN,
                "SLURM_STEP_TASKS_PER_NODE": "4(x3)",
                "SLURM_PROCID": "9",
                "SLURM_STEP_NUM_TASKS": "12",
                "SLURM_LOCALID": "1",
            },
            world(9, 12, 1, 4),
        ),  # fmt: skip
        ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": ""}, world(4, 5, 0, None)),
    ],
    ids=["openmpi", "mvapich", "pmi-hydra", "srun-uneven", "srun-even", "srun-no-per-node"],
)
def test_each_launchers_variables_give_the_world(launcher_env, expected):
    assert launcher_world({**launcher_env, **MASTER}) == expected


def test_a_process_the_deepspeed_launcher_started_is_left_alone():
    assert launcher_world({**OPENMPI, "RANK": "0", "WORLD_SIZE": "2"}) == {}
    assert launcher_world({}) == {}


def test_the_sbatch_script_itself_is_no_rank():
    """SLURM_PROCID/SLURM_NTASKS are set in the batch script too; only srun sets STEP_NUM_TASKS."""
    assert launcher_world({**SBATCH_SCRIPT, **MASTER}) == {}


def test_the_innermost_launcher_wins():
    """mpirun inside an sbatch job (the ranks inherit the script's SLURM_*), and srun
    --mpi=pmi2 (PMI_RANK/PMI_SIZE without a local rank: Slurm's own variables are used)."""
    assert launcher_world({**SBATCH_SCRIPT, **OPENMPI, **MASTER}) == world(5, 8, 1, 4)
    pmi2 = {"PMI_RANK": "4", "PMI_SIZE": "5"}
    assert launcher_world({**SRUN, **pmi2, **MASTER}) == world(4, 5, 0, 1)


def test_a_world_of_one_is_left_to_init():
    one = {**OPENMPI, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}  # fmt: skip
    assert launcher_world(one) == {}  # no MASTER_* needed: dist.init makes a world of one


def test_agreeing_variables_already_set_are_fine():
    env = {**OPENMPI, **MASTER, "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert launcher_world(env) == world(5, 8, 1, 4)


@pytest.mark.parametrize(
    "missing", [("MASTER_ADDR",), ("MASTER_PORT",), ("MASTER_ADDR", "MASTER_PORT")]
)
def test_a_world_of_several_needs_the_master_address(missing):
    env = {**OPENMPI, **MASTER}
    for name in missing:
        del env[name]
    # the launcher, the rank and world it gave, what is missing, and how to give it
    msg = refusal(env)
    assert_names(msg, "OpenMPI", "5", "8", *missing, "launchers/openmpi.sh")
    assert "-x MASTER_ADDR=" in msg  # mpirun's flag, as it is written


@pytest.mark.parametrize(
    "change,facts",
    [
        ({"OMPI_COMM_WORLD_RANK": "8"}, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "8"]),
        ({"OMPI_COMM_WORLD_SIZE": "0"}, ["OMPI_COMM_WORLD_SIZE", "0"]),
        ({"OMPI_COMM_WORLD_RANK": "x"}, ["OMPI_COMM_WORLD_RANK='x'", "whole number"]),
        ({"OMPI_COMM_WORLD_RANK": "-1"}, ["OMPI_COMM_WORLD_RANK='-1'", "whole number"]),
        (
            {"OMPI_COMM_WORLD_LOCAL_RANK": "4"},
            ["OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "4"],
        ),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "9"}, ["OMPI_COMM_WORLD_LOCAL_SIZE", "9", "8"]),
        ({"WORLD_SIZE": "2"}, ["WORLD_SIZE=2", "OpenMPI", "8", "unset WORLD_SIZE"]),
        ({"LOCAL_RANK": "0"}, ["LOCAL_RANK=0", "OpenMPI", "1", "unset LOCAL_RANK"]),
    ],
)
def test_inconsistent_variables_are_refused_by_name(change, facts):
    """The variable at fault, the values that disagree, and the fix where there is one."""
    assert_names(refusal({**OPENMPI, **MASTER, **change}), *facts)


def test_incomplete_variables_are_refused():
    env = {"OMPI_COMM_WORLD_SIZE": "2", **MASTER}
    msg = refusal(env)
    # what the launcher set and did not, and the variables to set instead
    assert_names(msg, "OpenMPI", "OMPI_COMM_WORLD_SIZE")
    assert_names(msg, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
    assert_names(msg, "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def test_srun_local_rank_beyond_its_nodes_tasks_is_refused():
    # node 2 runs one task
    msg = refusal({**SRUN, **MASTER, "SLURM_LOCALID": "1"})
    assert_names(msg, "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE")


def test_adopt_sets_the_variables_and_the_helpers_read_them():
    environ = {**OPENMPI, **MASTER}
    assert adopt_launcher_world(environ) == world(5, 8, 1, 4)
    assert environ["RANK"] == "5" and environ["WORLD_SIZE"] == "8"
    assert adopt_launcher_world(environ) == {}  # RANK is set now: a second call changes nothing


def test_train_main_adopts_before_planning(monkeypatch, capsys):
    """The error is GptDsError, so train.main says it in one line and exits 2; it comes before
    any argument or data check, i.e. before plan_run reads WORLD_SIZE."""
    from gpt_ds import train

    launched_by(monkeypatch, OPENMPI)
    assert issubclass(LauncherWorldError, GptDsError)
    assert train.main(["--data_dir", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")  # the one-line error, not a traceback
    assert_names(err.splitlines()[0], "OpenMPI", "5", "8", "MASTER_ADDR", "MASTER_PORT")


def test_adopted_world_is_what_the_rank_helpers_report(monkeypatch):
    launched_by(monkeypatch, {**OPENMPI, **MASTER})
    adopt_launcher_world()
    seen = (dist.rank(), dist.world_size(), dist.local_rank(), dist.local_world_size())
    assert seen == (5, 8, 1, 4)
