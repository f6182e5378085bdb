"""Two "nodes" on loopback (127.0.0.1 and 127.0.0.2, the sshd of tests/helpers/sshd.py) under
DeepSpeed's OpenMPI runner: `deepspeed --hostfile H --launcher openmpi` -> `mpirun -n 2`.

What is proved: mpirun (Debian's OpenMPI, as root, TCP on `lo` only) starts rank 1 through the
sshd of 127.0.0.2; both ranks read one world of 2 from OMPI_COMM_WORLD_* (DeepSpeed's runner
sets no RANK/WORLD_SIZE/MASTER_*), get MASTER_ADDR/MASTER_PORT and an expanded PATH (ninja,
`hostname`) from the `.deepspeed_env` of launchers/env.sh; launchers/openmpi.sh trains a world
of 2 with the losses of `deepspeed --num_gpus 2` on one node. No mpi4py: nothing calls MPI.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers.compared_runs import BASE, WHOLE, assert_losses_close, compared_run
from helpers.shared import shared_folder
from helpers.sshd import probe_records, sshd_fixture
from helpers.system import Unavailable, ensure_packages
from support.launch import REPO, VENV_BIN, free_port, launch_env, remove_shm_buffers, tiny_run_args

pytestmark = pytest.mark.slow
ssh_loopback = sshd_fixture()

NODES = ("127.0.0.1", "127.0.0.2")
# mpirun's own traffic (its daemons, and any MPI byte transfer) on loopback only; as root
MPI_ARGS = "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --allow-run-as-root"
PROBE = """\
import json, os, shutil, sys
from gpt_ds.base.launcher_world import adopt_launcher_world
adopted = adopt_launcher_world()
conn = os.environ.get("SSH_CONNECTION", "").split()
sys.stdout.write("PROBE " + json.dumps({
    "adopted": adopted, "ssh_server": conn[2] if len(conn) > 2 else None,
    "path": os.environ["PATH"], "ninja": shutil.which("ninja"),
    "hostname": shutil.which("hostname"), "executable": sys.executable,
    "master": [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")],
}) + "\\n")  # one write: mpirun interleaves two ranks' separate writes
sys.stdout.flush()
"""


@pytest.fixture(scope="module")
def openmpi() -> None:
    """Debian's OpenMPI (mpirun, ompi_info: what DeepSpeed's runner looks for), installed
    with apt-get where missing; skips with the reason where this machine cannot."""
    try:
        ensure_packages({"mpirun": "openmpi-bin", "ompi_info": "openmpi-bin"})
    except Unavailable as exc:
        pytest.skip(f"OpenMPI unavailable: {exc}")


def hostfile(tmp_path: Path) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{n} slots=1\n" for n in NODES))
    return path


def write_ds_env(path: Path, env: dict[str, str], port: int) -> str:
    """launchers/env.sh's gpt_ds_write_ds_env for GPT_DS_LAUNCHER=openmpi; returns its text."""
    script = f'. launchers/env.sh && gpt_ds_write_ds_env "{path}"'
    run_env = {
        **env,
        "GPT_DS_LAUNCHER": "openmpi",
        "MASTER_ADDR": NODES[0],
        "MASTER_PORT": str(port),
    }
    subprocess.run(["bash", "-c", script], cwd=REPO, env=run_env, check=True, timeout=60)
    return path.read_text()


def run(cmd: list[str], env: dict[str, str], port: int, timeout: float = 600):
    """Run a launch from the project dir; always unlink its /dev/shm buffers."""
    try:
        return subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    finally:
        remove_shm_buffers(NODES[0], port)


def explain(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout[-8000:], proc.stderr[-8000:]
    return f"rc={proc.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


def test_mpirun_ranks_are_one_world_with_expanded_path(openmpi, ssh_loopback, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    port = free_port()
    env = launch_env()
    ds_env = tmp_path / "ds_env"
    written = write_ds_env(ds_env, env, port)
    assert f"MASTER_ADDR={NODES[0]}\nMASTER_PORT={port}\n" in written
    path_line = next(line for line in written.splitlines() if line.startswith("PATH="))
    assert "$" not in path_line and path_line.startswith(f"PATH={VENV_BIN}:")
    env["DS_ENV_FILE"] = str(ds_env)
    cmd = [
        str(VENV_BIN / "deepspeed"), "--hostfile", str(hostfile(tmp_path)),
        "--launcher", "openmpi", "--launcher_args", MPI_ARGS,
        "--master_addr", NODES[0], "--master_port", str(port), str(probe),
    ]  # fmt: skip
    proc = run(cmd, env, port, timeout=300)
    assert proc.returncode == 0, explain(proc)
    both = proc.stdout + proc.stderr
    assert re.search(r"cmd = mpirun -n 2 -hostfile \S+ .* -x PATH=/[^\"$ ]+ ", both), both[-3000:]
    ranks = sorted(
        probe_records(proc.stdout),
        key=lambda r: int(r["adopted"]["RANK"]),
    )  # fmt: skip
    assert [r["adopted"] for r in ranks] == [
        {"RANK": str(i), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        for i in (0, 1)
    ], proc.stdout[-3000:]
    assert ranks[1]["ssh_server"] == NODES[1]  # rank 1 runs in the session of 127.0.0.2's sshd
    for r in ranks:
        assert r["master"] == [NODES[0], str(port)]
        assert Path(r["executable"]).parent == VENV_BIN
        assert "$" not in r["path"] and '"' not in r["path"], r["path"]
        assert r["ninja"] == str(VENV_BIN / "ninja") and r["hostname"], r


def test_two_nodes_over_openmpi_train_like_one_node(
    openmpi, ssh_loopback, shakespeare_dir, tmp_path_factory, tmp_path
):
    """launchers/openmpi.sh: preflight, .deepspeed_env, then `deepspeed --launcher openmpi`;
    the losses equal those of the same run under `deepspeed --num_gpus 2` on one node."""
    root = shared_folder(tmp_path_factory, "compared_runs")  # conftest's `runs` too
    reference, _ = compared_run(shakespeare_dir, root, 2, **WHOLE)
    out, port = tmp_path / "out", free_port()
    env = launch_env()
    env.update(
        GPT_DS_HOSTFILE=str(hostfile(tmp_path)),
        MASTER_ADDR=NODES[0],
        MASTER_PORT=str(port),
        DS_ENV_FILE=str(tmp_path / "ds_env"),
        GPT_DS_MIN_FREE_GB="0.1",
        GPT_DS_NET_IF="lo",
    )
    args = tiny_run_args(
        shakespeare_dir, out, **{**BASE, **WHOLE, "deepspeed_config": "ds_configs/zero2.json"}
    )
    start = time.monotonic()
    proc = run([str(REPO / "launchers" / "openmpi.sh"), *args], env, port)
    assert proc.returncode == 0, explain(proc)
    both = proc.stdout + proc.stderr
    assert "preflight: all 2 hosts ready" in both
    assert re.search(r"cmd = mpirun -n 2 -hostfile .* --mca btl_tcp_if_include lo ", both)
    assert ("--allow-run-as-root" in both) == (os.geteuid() == 0)  # openmpi.sh adds it as root
    ranks = set(re.findall(r"rank (\d+)/(\d+) on host", proc.stdout))
    assert ranks == {("0", "2"), ("1", "2")}, proc.stdout[-3000:]  # one world of 2, not 2 of 1
    assert "batch: 8 per rank x 1 accumulation steps x 2 ranks" in proc.stdout
    assert_losses_close(out, reference)
    shards = sorted(p.name for p in (out / "final").glob("*zero_pp_rank_*optim_states.pt"))
    assert len(shards) == 2 and "rank_1" in shards[1], shards  # rank 1 saved its shard
    print(f"two-node OpenMPI run: {time.monotonic() - start:.0f} s")
