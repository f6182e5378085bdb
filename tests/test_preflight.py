"""Hostfile parsing (against DeepSpeed's own parser) and the multi-node preflight check.

The slow tests run preflight over real ssh to loopback "nodes" (tests/helpers/sshd.py): all
green, an unreachable node, and a node whose Python sees another deepspeed version (its sshd
runs in a private mount namespace where the installed deepspeed's METADATA says 0.18.0: a real
file difference at the same path, as on a badly provisioned machine).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.messages import assert_names
from helpers.sshd import sshd_fixture
from support.launch import REPO, free_port, launch_env

from gpt_ds.base.errors import ConfigError
from gpt_ds.launch.checks import Check, HostChecks, PreflightResult, format_result
from gpt_ds.launch.hostfile import HostEntry, parse_hostfile_text, read_hostfile
from gpt_ds.launch.preflight import (
    PreflightOptions,
    default_master_addr,
    master_query,
    run_preflight,
)
from gpt_ds.launch.probe import (
    MasterListener,
    deepspeed_exports,
    ds_quote,
    parse_probe_output,
    probe_script,
    remote_command,
    run_probe,
)

ssh_loopback = sshd_fixture()

GOOD = """\
# two nodes, 8 GPUs each
worker-1 slots=8

  worker-2\tslots=8   max_slots=8   # OpenMPI's extra field and a trailing comment: ignored
10.0.0.7 slots=4\r
"""


def host_slots(entries: list[HostEntry]) -> dict[str, int]:
    """host -> slots in file order: what DeepSpeed's `fetch_hostfile` returns for the file."""
    return {e.host: e.slots for e in entries}


def ds_parse(text: str):
    from deepspeed.launcher.runner import _parse_hostfile

    return _parse_hostfile(text.splitlines(keepends=True))


# --- hostfile ----------------------------------------------------------------------------------


def test_good_hostfile_matches_deepspeed():
    entries = parse_hostfile_text(GOOD)
    assert [(e.host, e.slots, e.line) for e in entries] == [
        ("worker-1", 8, 2),
        ("worker-2", 8, 4),
        ("10.0.0.7", 4, 5),
    ]
    assert host_slots(entries) == dict(ds_parse(GOOD))


@pytest.mark.parametrize(
    "line, facts",
    [
        ("worker-3", ["'slots=N'"]),
        ("worker-3 slots = 4", ["'slots=N'", "'='"]),  # no spaces around it
        ("worker-3 slots=", ["'slots=N'"]),
        ("worker-3 slots=-2", [">= 1"]),
        ("worker-3 gpus=4", ["'slots=N'"]),
        ("slots=4", ["host"]),  # it is missing
        ("worker-3:slots=4", ["'HOST slots=N'"]),
    ],
)
def test_each_malformed_kind_is_what_deepspeed_rejects(line, facts):
    text = GOOD + line + "\n"
    with pytest.raises(ValueError, match="bad entry"):
        ds_parse(text)
    with pytest.raises(ConfigError) as err:
        parse_hostfile_text(text, source="hf")
    (problem,) = err.value.problems
    assert problem.startswith("line 6: ")  # the line at fault, first
    assert_names(problem, repr(line), *facts)


@pytest.mark.parametrize(
    "line, facts",
    [
        ("worker-3 slots=0", ["'worker-3 slots=0'", "slots=0", "remove the line"]),
        ("worker-3 slots=4x", ["'worker-3 slots=4x'", "'4x'", "4"]),  # what DeepSpeed reads
        ("worker-3,worker-4 slots=4", ["'worker-3,worker-4'", "','", "pdsh", "--include"]),
        ("worker@3 slots=4", ["'worker@3'", "'@'", "pdsh", "--include"]),
    ],
)
def test_lines_deepspeed_accepts_but_break_later(line, facts):
    text = GOOD + line + "\n"
    ds_parse(text)  # DeepSpeed lets it through...
    with pytest.raises(ConfigError) as err:  # ...we say why it will go wrong
        parse_hostfile_text(text)
    (problem,) = err.value.problems
    assert_names(problem, "line 6", *facts)


def test_every_problem_reported_at_once_with_line_numbers():
    text = "a slots=2\nb slots 2\n\n# ok\nc slots=0\na slots=1\nd\n"
    with pytest.raises(ConfigError) as err:
        parse_hostfile_text(text, source="hostfile")
    lines = [p.split(":")[0] for p in err.value.problems]
    assert lines == ["line 2", "line 5", "line 6", "line 7"]
    assert_names(err.value.problems[2], "'a'", "line 1")  # the host, its first line
    with pytest.raises(ValueError, match="bad entry"):
        ds_parse(text)


def test_empty_and_missing_hostfiles(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse_hostfile_text("# nothing\n\n")
    assert_names(str(err.value), "hosts", "'worker-1 slots=8'")  # none, and a line to add
    with pytest.raises(ValueError, match="empty"):
        ds_parse("# nothing\n\n")
    with pytest.raises(ConfigError) as err:
        read_hostfile(tmp_path / "hostfile")
    # the file, what to write in it, the example
    assert_names(str(err.value), str(tmp_path / "hostfile"), "'HOST slots=N'", "hostfile.example")


def test_example_hostfile_parses():
    entries = read_hostfile(REPO / "hostfile.example")
    assert entries and host_slots(entries) == dict(
        ds_parse((REPO / "hostfile.example").read_text())
    )


# --- what DeepSpeed exports to remote ranks ------------------------------------------------------


@pytest.mark.parametrize("value", ["/a/b:c", "$HOME/x", "a b", "x=1,y@2%", 'q"uote'])
def test_export_quoting_is_deepspeeds(value):
    from deepspeed.launcher.multinode_runner import MultiNodeRunner

    runner = SimpleNamespace(exports={})
    MultiNodeRunner.add_export(runner, "K", value)
    assert ds_quote(value) == runner.exports["K"]


def test_deepspeed_env_file_read_like_deepspeed_and_bad_lines_flagged(tmp_path):
    env = {"DS_ENV_FILE": str(tmp_path / "ds_env"), "NCCL_DEBUG": "WARN", "HOME_X": "no"}
    (tmp_path / "ds_env").write_text("TORCH_EXTENSIONS_DIR=/x/ext\nOMP_NUM_THREADS = 4\n")
    exports, problems = deepspeed_exports("/proj", env)
    assert exports == {
        "NCCL_DEBUG": "WARN",
        "PYTHONPATH": "/proj",
        "TORCH_EXTENSIONS_DIR": "/x/ext",
        "OMP_NUM_THREADS": "4",
    }
    assert problems == []
    (tmp_path / "ds_env").write_text("A=1\n\n# note=x\n")
    _, problems = deepspeed_exports("/proj", env)
    assert len(problems) == 2 and "line 2" in problems[0] and "line 3" in problems[1]


# --- the probe, run locally ---------------------------------------------------------------------


def test_probe_reports_this_environment(tmp_path):
    req = {
        "project_dir": str(REPO),
        "code_files": ["gpt_ds/launch/hostfile.py", "gpt_ds/no_such_file.py"],
        "checkpoint_dir": str(tmp_path / "not" / "yet"),
    }
    cmd = remote_command(sys.executable, {"PYTHONPATH": str(REPO), "MARK": "a b"})
    rc, out, err = run_probe(["sh", "-c", cmd], probe_script(req), timeout=120)
    assert rc == 0, err
    got = parse_probe_output("banner from .bashrc\n" + out)
    assert got["python"] == ".".join(map(str, sys.version_info[:3]))
    assert got["torch"] == importlib.metadata.version("torch")
    assert got["deepspeed"] == importlib.metadata.version("deepspeed")
    assert got["project_exists"] and got["code"]["gpt_ds/no_such_file.py"] is None
    assert got["disk_path"] == str(tmp_path) and got["disk_writable"]
    assert got["device_count"] == 0 or got["device_kind"] in ("cuda", "rocm")


def test_local_preflight_fails_devices_when_deepspeed_would_not_use_the_gpus(tmp_path):
    """The GPU check rides along with the probe: DS_ACCELERATOR=cuda where torch sees no GPU
    (a CPU torch here) fails the devices cell with the fix (gpt_ds.launch.gpu_support's branches are
    in tests/test_gpu_support.py)."""
    opts = PreflightOptions(
        local=True,
        slots=2,
        master_port=free_port(),
        checkpoint_dir=str(tmp_path / "ckpt"),
        min_free_gb=0.01,
        timeout=120,
    )
    env = launch_env()
    plain = run_preflight(opts, env=env)
    if plain.local.get("device_count"):
        pytest.skip("torch sees a GPU here")
    assert plain.ok  # CPU ranks on a machine without GPUs: fine
    result = run_preflight(opts, env=dict(env, DS_ACCELERATOR="cuda"))
    cell = result.hosts[0].checks["devices"]
    assert not result.ok and cell.ok is False and cell.text == "GPU unseen"
    assert "DeepSpeed's accelerator is 'cuda' (DS_ACCELERATOR=cuda) but torch sees no GPU" in (
        cell.fix
    )
    assert "fix: " in format_result(result) and "devices: DeepSpeed's accelerator" in (
        format_result(result)
    )


def test_master_port_in_use_is_reported():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with MasterListener("127.0.0.1", port) as listener:
            assert listener.local and listener.error == "port in use here"
    with MasterListener("127.0.0.1", port) as listener:
        assert listener.error is None
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


# ssh as the preflight calls it (options, host, command): answers the two address queries
STAND_IN_SSH = r"""#!/bin/sh
for word; do last=$word; done
echo "$last" >> "$(dirname "$0")/asked"
case $last in
    "hostname -I") echo "10.0.0.5 172.17.0.1 fd00::5" ;;
    "ip -4 -o addr show dev ib0") echo "3: ib0    inet 10.1.0.5/16 brd 10.1.255.255 scope global" ;;
    *) echo "Device does not exist" >&2; exit 1 ;;
esac
"""


def test_the_default_master_is_the_address_multi_node_sh_picks(tmp_path):
    """No --master_addr: the first host's address on GPT_DS_NET_IF, else the first word of its
    `hostname -I`, asked over ssh (a stand-in here), else its name: launchers/multi_node.sh's
    rule, whose queries are these."""
    ssh = tmp_path / "ssh"
    ssh.write_text(STAND_IN_SSH)
    ssh.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    opts = PreflightOptions(hostfile="hostfile", timeout=10)
    assert default_master_addr("node-1", opts, env) == "10.0.0.5"
    assert default_master_addr("node-1", opts, {**env, "GPT_DS_NET_IF": "ib0"}) == "10.1.0.5"
    assert default_master_addr("node-1", opts, {**env, "GPT_DS_NET_IF": "eth9"}) == "node-1"
    asked = ["hostname -I", "ip -4 -o addr show dev ib0", "ip -4 -o addr show dev eth9"]
    assert (tmp_path / "asked").read_text().splitlines() == asked
    launcher = (REPO / "launchers" / "multi_node.sh").read_text()
    assert master_query("") == "hostname -I" and 'query="hostname -I"' in launcher
    assert master_query("IF") == "ip -4 -o addr show dev IF"
    assert 'query="ip -4 -o addr show dev $GPT_DS_NET_IF"' in launcher


def test_result_table_and_fix_lines():
    good = {n: Check(True, "fine") for n in ("ssh", "project", "python")}
    bad = dict(good, python=Check(False, "3.10.1 != 3.11.7", "install python 3.11.7"))
    result = PreflightResult(
        local={"python": "3.11.7", "executable": "/v/bin/python", "torch": "2", "deepspeed": "0"},
        hosts=[HostChecks("n1", 8, good), HostChecks("n2", 8, bad)],
        problems=["bad .deepspeed_env"],
        master="n1:29500",
    )
    text = format_result(result)
    assert "fix: bad .deepspeed_env" in text
    assert "fix: n2 python: install python 3.11.7" in text
    assert "1 of 2 hosts failed" in text
    row = next(line for line in text.splitlines() if line.startswith("n2"))
    assert "✗ 3.10.1 != 3.11.7" in row or "X 3.10.1 != 3.11.7" in row


# --- over real ssh (slow) ------------------------------------------------------------------------


def preflight(hostfile: Path, *args: str) -> subprocess.CompletedProcess:
    """`python tools/preflight.py`, as a user runs it, from the project directory."""
    env = launch_env()
    env["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "preflight.py"), "--hostfile", str(hostfile), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def rows(stdout: str) -> dict[str, str]:
    return {line.split()[0]: line for line in stdout.splitlines() if line.startswith("127.")}


def common_args(tmp_path: Path) -> list[str]:
    return [
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        "--checkpoint_dir", str(tmp_path / "ckpt"), "--min_free_gb", "0.01", "--timeout", "60",
    ]  # fmt: skip


@pytest.mark.slow
def test_unreachable_node_reported(ssh_loopback, tmp_path):
    ssh_loopback.dead_address("127.0.0.3")  # ~/.ssh/config: a port where nothing listens
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\n127.0.0.3 slots=1\n")
    proc = preflight(hostfile, *common_args(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table = rows(proc.stdout)
    assert "✗" not in table["127.0.0.1"]
    assert "✗ connection refused" in table["127.0.0.3"]
    assert table["127.0.0.3"].count("–") == 7  # nothing else could be checked
    assert "fix: 127.0.0.3 ssh: start sshd on 127.0.0.3" in proc.stdout
    assert "1 of 2 hosts failed" in proc.stdout


@pytest.mark.slow
def test_deepspeed_version_mismatch_reported(ssh_loopback, tmp_path):
    dist = importlib.metadata.distribution("deepspeed")
    real = next(Path(dist.locate_file(f)) for f in dist.files if f.name == "METADATA")
    fake = tmp_path / "METADATA"
    here = dist.version
    fake.write_text(real.read_text().replace(f"Version: {here}", "Version: 0.18.0", 1))
    try:
        node = ssh_loopback.start_sshd(("127.0.0.4",), bind_mounts={str(fake): str(real)})
    except Exception as exc:  # no mount namespaces here (e.g. an unprivileged container)
        pytest.skip(f"cannot give 127.0.0.4 its own view of the files: {exc}")
    try:
        assert importlib.metadata.version("deepspeed") == here  # this node is untouched
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("127.0.0.1 slots=1\n127.0.0.4 slots=1\n")
        proc = preflight(hostfile, *common_args(tmp_path))
    finally:
        ssh_loopback.stop_sshd(node)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table = rows(proc.stdout)
    assert "✗" not in table["127.0.0.1"]
    assert f"✗ 0.18.0 != {here}" in table["127.0.0.4"]
    assert table["127.0.0.4"].count("✗") == 1  # python, torch, code, devices, master, disk fine
    assert f"fix: 127.0.0.4 deepspeed: deepspeed 0.18.0 on 127.0.0.4 but {here} here" in proc.stdout
    assert f"-m pip install deepspeed=={here}" in proc.stdout


def test_bad_hostfile_exits_2_with_every_line(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\n127.0.0.2 slots 1\n127.0.0.1 slots=1\n")
    proc = preflight(hostfile)
    assert proc.returncode == 2
    assert_names(proc.stderr, "line 2", "line 3")


def test_launchers_exist_and_parse():
    """Launchers the docs point at are there, executable and `bash -n` clean."""
    for name in MY_SCRIPTS:
        path = REPO / "launchers" / name
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path}: {proc.stderr}"
        assert name == "env.sh" or os.access(path, os.X_OK), f"{path} is not executable"


MY_SCRIPTS = [
    "env.sh", "single_node.sh", "multi_node.sh", "openmpi.sh", "run_node.sh", "slurm.sbatch",
    "docker/run.sh",
]  # fmt: skip


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (CFS quota)


@contextlib.contextmanager
def cpu_quota(pid: int, share: float):
    """`pid` and every process it starts from now on get `share` of one core (cgroup v1)."""
    group = CPU_CGROUP / f"gpt_ds_test_{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(share * 100000)))
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        for proc in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_CGROUP / "cgroup.procs").write_text(proc)
        group.rmdir()


def burn_in_lines(out: str) -> str:
    """The burn-in's figures and flags in `out` (rank 0's lines come prefixed by its node)."""
    keys = ("burn-in", "matmul", "bandwidth", "point-to-point", "slow:", "below half")
    return "\n".join(ln for ln in out.splitlines() if any(k in ln for k in keys))


@pytest.mark.slow
@pytest.mark.alone  # its healthy nodes must measure alike: no other worker's ranks beside them
def test_burn_in_reports_every_figure_and_flags_a_throttled_node(ssh_loopback, tmp_path):
    """Issue 25: `--burn_in` launches gloo over three loopback nodes (each its own sshd, so one
    node's ranks can be throttled: its sshd in a cgroup with 20% of a core): every figure, that
    node flagged on compute, the others not. One launch: that a healthy set flags nothing is
    slow_flags' to show (tests/test_burn_in.py), and the two healthy nodes here do not. The
    preflight table before it is all green: the throttled node is slow, not broken."""
    if not os.access(CPU_CGROUP, os.W_OK):
        pytest.skip(f"{CPU_CGROUP} is not writable here: no CPU quota for one node")
    third = ssh_loopback.start_sshd(("127.0.0.3",))
    try:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
        burn_in = ["--burn_in", "--burn_in_model", "gpt2-mini"]
        with cpu_quota(third.proc.pid, share=0.2):
            throttled = preflight(hostfile, *common_args(tmp_path), *burn_in)
        out = throttled.stdout
        assert throttled.returncode == 0, out[-3000:] + throttled.stderr[-3000:]
        table = rows(out.split("\nburn-in: ", 1)[0])  # pdsh prefixes the ranks' lines too
        assert set(table) == {"127.0.0.1", "127.0.0.2", "127.0.0.3"}, out[-3000:]
        for row in table.values():
            assert "✗" not in row and row.count("✓") == 8, row
        assert "0/cpu" in table["127.0.0.2"] and "same code" in table["127.0.0.2"]
        assert "all 3 hosts ready" in out and "fix:" not in out
        assert "burn-in: 3 ranks on 3 node(s), gloo" in out, out[-3000:]
        for host in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
            assert f"matmul {host}: " in out
        assert "all_reduce 64 MiB bus bandwidth" in out and "all_gather 64 MiB" in out
        assert out.count("point-to-point 127.0.0.") == 3  # every pair of nodes
        assert "expected communication per optimizer step (gpt2-mini, ZeRO-2" in out
        assert "slow: 127.0.0.3: matmul" in out and "check its clocks" in out, burn_in_lines(out)
        assert "slow: 127.0.0.1: matmul" not in out and "slow: 127.0.0.2: matmul" not in out
    finally:
        ssh_loopback.stop_sshd(third)
