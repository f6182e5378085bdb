"""Two "nodes" on loopback (127.0.0.1 and 127.0.0.2, each its own sshd): DeepSpeed's pdsh
hostfile runner and its --no_ssh mode train exactly like one node with two ranks.

What is proved: pdsh reaches each address through ~/.ssh/config (port and key, no --ssh_port),
remote ranks run the launcher's (the venv's) Python and get `.deepspeed_env` (here the JIT
cache dir) though ssh gives them a fresh environment; node 1's rank really runs in the session
of 127.0.0.2's sshd; both nodes train, evaluate and write their checkpoint shards; the losses
equal those of `deepspeed --num_gpus 2` on one node. Also: launchers/slurm.sbatch (with
stand-ins for scontrol and srun) checkpoints and stops on its warning signal.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers.compared_runs import BASE, ITERS, WHOLE, compared_run
from helpers.logged import train_losses, val_losses
from helpers.shared import shared_folder
from helpers.sshd import probe_records, sshd_fixture
from support.launch import REPO, VENV_BIN, free_port, launch_env, remove_shm_buffers, tiny_run_args

from gpt_ds.observe.metrics_file import read_metrics

pytestmark = pytest.mark.slow
ssh_loopback = sshd_fixture()

NODES = ("127.0.0.1", "127.0.0.2")
PROBE = """\
import json, os, sys
conn = os.environ.get("SSH_CONNECTION", "").split()
sys.stdout.write("PROBE " + json.dumps({
    "rank": int(os.environ["RANK"]), "node": int(os.environ["CROSS_RANK"]),
    "world": int(os.environ["WORLD_SIZE"]), "ssh_server": conn[2] if len(conn) > 2 else None,
    "executable": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(),
    "ext_dir": os.environ.get("TORCH_EXTENSIONS_DIR"), "marker": os.environ.get("GPT_DS_MARK"),
}) + "\\n")  # one write: mpirun interleaves two ranks' separate writes
sys.stdout.flush()
"""


def train_args(data_dir: Path, out_dir: Path) -> list[str]:
    return [
        "--deepspeed_config", "ds_configs/zero2.json", "--model", "gpt2-tiny",
        "--data_dir", str(data_dir), "--out_dir", str(out_dir),
        "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "2",
        "--micro_batch_size", "2", "--grad_accum", "1", "--block_size", "64", "--seed", "1337",
        "--log_interval", "1",
    ]  # fmt: skip


def hostfile(tmp_path: Path) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{n} slots=1\n" for n in NODES))
    return path


def run(cmd: list[str], env: dict[str, str], port: int, timeout: float = 900):
    """Run a launch from the project dir; always unlink its /dev/shm buffers."""
    try:
        return subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    finally:
        remove_shm_buffers("127.0.0.1", port)


def explain(proc: subprocess.CompletedProcess) -> str:
    out, err = proc.stdout[-8000:], proc.stderr[-8000:]
    return f"rc={proc.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"


def rank_lines(stdout: str) -> set[tuple[int, int]]:
    """(rank, node) pairs from train.py's `rank R/W on host H node N ...` lines."""
    found = re.findall(r"rank (\d+)/2 on host \S+ node (\d+)", stdout)
    return {(int(r), int(n)) for r, n in found}


def reference_args(data_dir: Path, out_dir: Path) -> list[str]:
    """The run of helpers.compared_runs' shared ZeRO-2 baseline (BASE + WHOLE), which
    conftest's `runs(2, **WHOLE)` launched on one node with two ranks."""
    flags = {**BASE, **WHOLE, "deepspeed_config": "ds_configs/zero2.json"}
    return tiny_run_args(data_dir, out_dir, **flags)


def assert_same_run(out: Path, ref: Path) -> None:
    """The same losses as the one-node run, evaluations and checkpoints on both nodes."""
    a, b = train_losses(out), train_losses(ref)
    assert sorted(a) == list(range(1, ITERS + 1)), a
    assert sorted(a) == sorted(b)
    for it in a:
        assert math.isclose(a[it], b[it], rel_tol=0, abs_tol=1e-5), (it, a[it], b[it])
    ea, eb = val_losses(out), val_losses(ref)
    assert sorted(ea) == [2, ITERS] and sorted(ea) == sorted(eb), (ea, eb)
    for it in ea:
        assert math.isclose(ea[it], eb[it], rel_tol=0, abs_tol=1e-5), (it, ea[it], eb[it])
    tag = (out / "latest").read_text().strip()
    assert tag == "final" and (out / "iter_2").is_dir()
    for t in ("iter_2", "final"):
        shards = sorted(p.name for p in (out / t).glob("*zero_pp_rank_*optim_states.pt"))
        assert len(shards) == 2 and "rank_1" in shards[1], (t, shards)  # node 1 saved its shard


def pdsh_env(tmp_path: Path, port: int) -> dict[str, str]:
    """launchers/multi_node.sh's knobs for the two loopback nodes."""
    env = launch_env()
    env.update(
        GPT_DS_HOSTFILE=str(hostfile(tmp_path)),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        DS_ENV_FILE=str(tmp_path / "ds_env"),
        GPT_DS_MIN_FREE_GB="0.1",
        GPT_DS_NET_IF="lo",
    )
    return env


@pytest.fixture
def single_node_reference(shakespeare_dir, tmp_path_factory) -> Path:
    """The same run as `deepspeed --num_gpus 2` on one node (shared with other tests)."""
    root = shared_folder(tmp_path_factory, "compared_runs")  # conftest's `runs` too
    out, stdout = compared_run(shakespeare_dir, root, 2, **WHOLE)
    assert rank_lines(stdout) == {(0, 0), (1, 0)}, stdout[-3000:]
    return out


def test_pdsh_ranks_get_the_venv_python_and_deepspeed_env(ssh_loopback, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    mark, ext_dir = uuid.uuid4().hex, str(tmp_path / "ext")
    ds_env = tmp_path / "ds_env"
    ds_env.write_text(f"TORCH_EXTENSIONS_DIR={ext_dir}\nGPT_DS_MARK={mark}\n")
    env = launch_env()
    env.pop("TORCH_EXTENSIONS_DIR")  # whatever arrives came through the file
    env["DS_ENV_FILE"] = str(ds_env)  # absolute: DeepSpeed reads it, not ~/.deepspeed_env
    port = free_port()
    cmd = [
        str(VENV_BIN / "deepspeed"), "--hostfile", str(hostfile(tmp_path)),
        "--master_addr", "127.0.0.1", "--master_port", str(port), str(probe),
    ]  # fmt: skip
    proc = run(cmd, env, port, timeout=300)
    assert proc.returncode == 0, explain(proc)
    assert re.search(
        r"cmd = pdsh -S -f \d+ -w 127\.0\.0\.1,127\.0\.0\.2 ", proc.stdout + proc.stderr
    )
    ranks = sorted(
        probe_records(proc.stdout),
        key=lambda r: r["rank"],
    )
    assert [(r["rank"], r["node"], r["world"]) for r in ranks] == [(0, 0, 2), (1, 1, 2)]
    assert [r["ssh_server"] for r in ranks] == list(NODES)  # each in its node's ssh session
    for r in ranks:
        assert r["prefix"] == sys.prefix and Path(r["executable"]).parent == VENV_BIN
        assert r["cwd"] == str(REPO)
        assert r["ext_dir"] == ext_dir and r["marker"] == mark


def test_two_nodes_over_pdsh_train_like_one_node(
    ssh_loopback, shakespeare_dir, single_node_reference, tmp_path
):
    """launchers/multi_node.sh: preflight, .deepspeed_env, then
    `deepspeed --hostfile H --master_addr 127.0.0.1 --master_port P gpt_ds/train.py ...`."""
    out = tmp_path / "out"
    port = free_port()
    env = pdsh_env(tmp_path, port)
    start = time.monotonic()
    cmd = [str(REPO / "launchers" / "multi_node.sh"), *reference_args(shakespeare_dir, out)]
    proc = run(cmd, env, port)
    assert proc.returncode == 0, explain(proc)
    both = proc.stdout + proc.stderr
    assert "preflight: all 2 hosts ready" in both
    assert re.search(r"cmd = pdsh .* -w 127\.0\.0\.1,127\.0\.0\.2 ", both)
    written = (tmp_path / "ds_env").read_text()
    assert f"TORCH_EXTENSIONS_DIR={env['TORCH_EXTENSIONS_DIR']}\n" in written
    assert "GLOO_SOCKET_IFNAME=lo\n" in written and "NCCL_SOCKET_IFNAME=lo\n" in written
    assert rank_lines(proc.stdout) == {(0, 0), (1, 1)}, proc.stdout[-3000:]
    assert_same_run(out, single_node_reference)
    print(f"two-node pdsh run: {time.monotonic() - start:.0f} s")


def test_two_nodes_without_ssh_train_like_one_node(
    shakespeare_dir, single_node_reference, tmp_path
):
    """launchers/run_node.sh on each "node" (DeepSpeed --no_ssh --node_rank), no ssh at all."""
    out = tmp_path / "out"
    port = free_port()
    env = launch_env()
    env.update(
        MASTER_PORT=str(port),
        GPT_DS_GPUS_PER_NODE="1",
        GPT_DS_MIN_FREE_GB="0.1",
        GPT_DS_NET_IF="lo",
    )
    node = [str(REPO / "launchers" / "run_node.sh")]
    args = ["127.0.0.1", "2", "--", *reference_args(shakespeare_dir, out)]
    procs: list[subprocess.Popen] = []
    try:
        procs += [
            subprocess.Popen(
                [*node, str(rank), *args],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in (0, 1)
        ]
        results = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        remove_shm_buffers("127.0.0.1", port)
    for p, (stdout, stderr) in zip(procs, results, strict=True):
        assert p.returncode == 0, f"rc={p.returncode}\n{stdout[-6000:]}\n{stderr[-6000:]}"
    assert "--node_rank=1" in results[1][0] + results[1][1]  # DeepSpeed's launch command
    assert rank_lines(results[0][0]) == {(0, 0)} and rank_lines(results[1][0]) == {(1, 1)}
    assert_same_run(out, single_node_reference)


FAKE_SCONTROL = """#!/bin/bash
# stands in for `scontrol show hostnames $SLURM_JOB_NODELIST`
printf '%s\\n' 127.0.0.1 127.0.0.2
"""
FAKE_SRUN = """#!/bin/bash
# stands in for `srun --ntasks-per-node=1 CMD`: CMD once per node with SLURM_NODEID, and
# SIGTERM forwarded to the tasks, as srun does
while [[ $1 == -* ]]; do shift; done
pids=()
for i in 0 1; do SLURM_NODEID=$i "$@" & pids+=($!); done
trap 'kill -TERM "${pids[@]}"' TERM
rc=0
for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do wait "$p" || rc=$?; done
done
exit $rc
"""


def test_slurm_batch_script_checkpoints_on_its_warning_signal(shakespeare_dir, tmp_path):
    """launchers/slurm.sbatch with stand-ins for scontrol and srun (no Slurm here): it writes
    the hostfile, starts run_node.sh per node, and on SIGTERM (what `--signal=B:TERM@120`
    sends) the ranks save a complete checkpoint and stop."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out, port = tmp_path / "out", free_port()
    env = launch_env()
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_SUBMIT_DIR=str(REPO),
        GPT_DS_HOSTFILE=str(tmp_path / "hostfile"),
        MASTER_PORT=str(port),
        GPT_DS_MIN_FREE_GB="0.1",
        GPT_DS_NET_IF="lo",
    )
    args = train_args(shakespeare_dir, out)
    args[args.index("--max_iters") + 1] = "100000"
    args[args.index("--eval_interval") + 1] = "100000"
    log = tmp_path / "job.log"
    with open(log, "w") as logf:
        job = subprocess.Popen(
            ["bash", str(REPO / "launchers" / "slurm.sbatch"), *args],
            cwd=tmp_path,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while len(train_losses(out, tolerate_partial_last_line=True)) < 3:
            assert job.poll() is None, log.read_text()[-6000:]
            assert time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(1)
        job.send_signal(15)
        job.wait(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
        remove_shm_buffers("127.0.0.1", port)
    text = log.read_text()
    assert (tmp_path / "hostfile").read_text() == "127.0.0.1 slots=1\n127.0.0.2 slots=1\n"
    assert rank_lines(text) == {(0, 0), (1, 1)}, text[-4000:]
    stopped = re.search(r"stopped at iteration (\d+); resume with --resume", text)
    assert stopped, text[-6000:]
    tag = f"iter_{stopped.group(1)}"
    assert (out / "latest").read_text().strip() == tag
    shards = sorted((out / tag).glob("*zero_pp_rank_*optim_states.pt"))
    assert len(shards) == 2, shards


def rank_processes(out: Path) -> list[psutil.Process]:
    """The training ranks (on either "node") of the run writing `out`."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "gpt_ds/train.py" in cmd and "--local_rank" in cmd and str(out) in cmd:
            found.append(p)
    return found


# alone: DeepSpeed's runner, signalled, runs `pkill -f "python -u -m deepspeed.launcher.launch"`
# on every node, which kills the other worker's launches too
@pytest.mark.alone
def test_a_signal_to_a_pdsh_launch_saves_on_every_node_and_the_job_continues(
    ssh_loopback, shakespeare_dir, tmp_path
):
    """SIGTERM to launchers/multi_node.sh (it execs DeepSpeed's runner: what `kill` or a
    scheduler hits): the runner interrupts pdsh and runs `pkill -f deepspeed.launcher.launch`
    on every node; each node's launcher passes SIGTERM to its rank, and every rank finishes its
    step, saves and exits by itself, well before that launcher's 30-s kill. The console after
    the signal is lost with pdsh; metrics.jsonl and `latest` say what was saved. The same
    command again (`--resume auto`) continues from that checkpoint to the end."""
    out, port = tmp_path / "out", free_port()
    args = [*train_args(shakespeare_dir, out), "--max_iters", "24", "--eval_interval", "0"]
    job = [str(REPO / "launchers" / "multi_node.sh"), *args, "--resume", "auto"]
    log = tmp_path / "first.log"
    with open(log, "w") as logf:
        first = subprocess.Popen(job, cwd=REPO, env=pdsh_env(tmp_path, port), stdout=logf,
                                 stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while len(train_losses(out, tolerate_partial_last_line=True)) < 3:
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(0.2)
        ranks = rank_processes(out)
        assert len(ranks) == 2, [r.cmdline() for r in ranks]
        first.send_signal(15)
        assert first.wait(timeout=60) == 1  # DeepSpeed's runner: sys.exit(1) after its pkill
        gone, alive = psutil.wait_procs(ranks, timeout=20)  # the launchers kill at 30 s
        assert alive == [], log.read_text()[-6000:]
    finally:
        if first.poll() is None:
            first.kill()
        for p in rank_processes(out):
            p.kill()
        remove_shm_buffers("127.0.0.1", port)
    tag = (out / "latest").read_text().strip()
    saved = [r for r in read_metrics(out) if r.get("event") == "checkpoint"]
    assert [r["tag"] for r in saved] == [tag] and tag == f"iter_{saved[0]['iter']}"
    assert 3 <= saved[0]["iter"] < 24
    shards = sorted((out / tag).glob("*zero_pp_rank_*optim_states.pt"))
    assert len(shards) == 2 and (out / tag / "gpt_ds.json").is_file(), shards

    port = free_port()
    again = run(job, pdsh_env(tmp_path, port), port)
    assert again.returncode == 0, explain(again)
    assert f"resumed from {out}/{tag} at iteration {saved[0]['iter']}" in again.stdout
    assert sorted(train_losses(out)) == list(range(1, 25))
