"""Check every node of a hostfile before a multi-node launch, and say how to fix what is wrong.

For each host, over `ssh -o BatchMode=yes` (what DeepSpeed's pdsh runner needs: a key, no
password, a known host key), one small Python program runs with the interpreter DeepSpeed will
use there (the launcher's own path, as the pdsh runner does) and the environment the ranks get
(`.deepspeed_env`, PYTHON* variables, PYTHONPATH = the project). It reports:

  ssh        reachable without a password
  project    the project directory exists at the same path, with the same code and configs
  python     same Python version          torch / deepspeed   same versions as here
  devices    GPUs torch sees (or 0/cpu), enough for the hostfile's slots (or --expected_devices),
             and usable: the driver new enough for torch's CUDA, kernels for every card's
             architecture, DeepSpeed on the GPUs (not silently on CPU): gpt_ds.launch.gpu_support
  master     a TCP connection to the master address works from there (see MasterListener)
  disk       free space and write access at the checkpoint directory

Hosts are checked concurrently, each within --timeout seconds. The result is a table of hosts x
checks and one "fix:" line per failure. gpt_ds/commands/preflight.py is the command line
(`gpt-ds-preflight`, `tools/preflight.py`), with the options of `PreflightOptions`. The probe
and how it reaches the nodes are in `gpt_ds.launch.probe`; the verdicts and the table in
`gpt_ds.launch.checks`.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.cli import option
from gpt_ds.base.errors import ConfigError, GptDsError
from gpt_ds.launch.checks import (
    CHECKS,
    Check,
    HostChecks,
    PreflightResult,
    code_check,
    devices_check,
    disk_check,
    gpu_check,
    master_check,
    ssh_failure,
    version_check,
)
from gpt_ds.launch.gpu_support import parse_probe_facts, probe_source
from gpt_ds.launch.hostfile import HostEntry, read_hostfile
from gpt_ds.launch.probe import (
    MasterListener,
    ProbeRun,
    deepspeed_exports,
    parse_probe_output,
    probe_script,
    remote_command,
    run_probe,
    ssh_base,
)

DEFAULT_MASTER_PORT = 29500  # DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT


@dataclass
class PreflightOptions:
    """Check every node of a DeepSpeed hostfile before launching: ssh, project path and code,
    Python/torch/deepspeed versions, devices, master reachability, disk. Paths are as every node
    sees them (DeepSpeed needs identical paths)."""

    hostfile: str | None = option(None, "DeepSpeed hostfile (HOST slots=N lines)", one_of="where")
    local: bool = option(
        False,
        "check this machine only, no ssh (single node, or one node of a --no_ssh launch)",
        one_of="where",
    )
    slots: int | None = option(None, "with --local: ranks on this machine (default: its GPUs)")
    node_rank: int = option(
        0,
        "with --local, in a --no_ssh launch: this node's rank (only node 0 binds the "
        "master port; the others check that they can reach it)",
    )
    master_addr: str | None = option(
        None,
        "master address (default: the one launchers/multi_node.sh picks, asked of the "
        "hostfile's first host over ssh: its IPv4 address on $GPT_DS_NET_IF (`ip -4 -o addr "
        "show dev IF`) if set, else the first word of its `hostname -I` (DeepSpeed's runner's "
        "rule), else the host's name; with --local: 127.0.0.1)",
    )
    master_port: int = option(DEFAULT_MASTER_PORT, "master port")
    expected_devices: int | None = option(None, "GPUs every node must see (default: >= its slots)")
    checkpoint_dir: str = option("out", "the run's --out_dir (relative: in the project)")
    min_free_gb: float = option(20.0, "free disk needed there")
    ssh_port: int | None = option(
        None, "ssh port (as `deepspeed --ssh_port`; default: ~/.ssh/config or 22)"
    )
    timeout: float = option(30.0, "seconds per host, ssh connection and remote checks together")
    python: str = option(
        help="interpreter the ranks run (DeepSpeed: the launcher's, i.e. this one)",
        default_factory=lambda: sys.executable,
    )
    project_dir: str = option(
        help="project path on every node (DeepSpeed `cd`s there)", default_factory=os.getcwd
    )
    burn_in: bool = option(
        False,
        "after the checks pass, launch the real backend over the ranks for under a minute: "
        "matmul TFLOP/s per device, all-reduce/all-gather bus bandwidth at the preset's "
        "buckets, point-to-point per node pair; slow ones flagged (gpt_ds/launch/burn_in.py)",
    )
    burn_in_preset: str = option("zero2", "with --burn_in: the preset whose buckets it times")
    burn_in_model: str = option("gpt2", "with --burn_in: the model its time per step is for")


# ----------------------------------------------------------------------------------------------
# Judging one host.


def judge_host(
    entry: HostEntry, run: ProbeRun, local: dict, opts: PreflightOptions, listener: MasterListener
) -> HostChecks:
    """Turn one host's probe run into its row of checks."""
    row = HostChecks(entry.host, entry.slots, {name: Check(None) for name in CHECKS})
    host, checks = entry.host, row.checks
    if run.returncode == -1 or run.returncode == 255:
        checks["ssh"] = ssh_failure(host, run.returncode, run.stderr)
        return row
    checks["ssh"] = Check(True, "ok")
    remote = parse_probe_output(run.stdout)
    if remote is None:
        tail = (run.stderr.strip().splitlines() or [f"exit code {run.returncode}"])[-1]
        missing = run.returncode == 127 or "No such file" in run.stderr
        checks["python"] = Check(
            False,
            "not found" if missing else "probe failed",
            f"{opts.python} {'does not exist' if missing else 'fails'} on {host} ({tail}): "
            "install the same environment at the same path on every node",
        )
        return row
    checks["project"] = code_check(remote, local, opts.project_dir, host)
    for name in ("python", "torch", "deepspeed"):
        checks[name] = version_check(name, remote, local, host, opts.python)
    devices = devices_check(remote, local, entry.slots, opts.expected_devices, host)
    checks["devices"] = gpu_check(devices, parse_probe_facts(run.stdout))
    checks["master"] = master_check(remote, listener, host)
    ckpt = _abs_checkpoint_dir(opts)
    checks["disk"] = disk_check(remote, opts.min_free_gb, ckpt, host)
    return row


# ----------------------------------------------------------------------------------------------
# The whole check.


def _abs_checkpoint_dir(opts: PreflightOptions) -> str:
    return os.path.normpath(os.path.join(opts.project_dir, opts.checkpoint_dir))


def code_files(project_dir: str) -> list[str]:
    """The files every node must have identical: the package and the DeepSpeed presets."""
    root = Path(project_dir)
    files = [*root.glob("gpt_ds/**/*.py"), *root.glob("ds_configs/*.json")]
    return sorted(str(p.relative_to(root)) for p in files if "__pycache__" not in p.parts)


def _entries(opts: PreflightOptions) -> list[HostEntry]:
    """The hosts to check: the hostfile's, or this machine with opts.local."""
    if opts.local:
        return [HostEntry(socket.gethostname(), opts.slots or 0, 0)]
    if opts.hostfile:
        return read_hostfile(opts.hostfile)
    raise ConfigError("give --hostfile HOSTFILE, or --local to check this machine only")


def master_query(net_if: str) -> str:
    """The command launchers/multi_node.sh runs on the first host for the master address."""
    return f"ip -4 -o addr show dev {shlex.quote(net_if)}" if net_if else "hostname -I"


def first_address(answer: str) -> str | None:
    """The address in the first line of `master_query`'s answer, read as multi_node.sh reads
    it: the 4th word up to its `/` (`ip -o`), else the first word (`hostname -I`)."""
    words = (answer.splitlines() or [""])[0].split()
    if len(words) > 3 and "/" in words[3]:
        return words[3].split("/")[0]
    return words[0] if words else None


def default_master_addr(host: str, opts: PreflightOptions, env: Mapping[str, str]) -> str:
    """The MASTER_ADDR launchers/multi_node.sh gives a launch without one: `host`'s address on
    $GPT_DS_NET_IF, else the first of its `hostname -I`, asked over ssh; else `host`."""
    query = master_query(env.get("GPT_DS_NET_IF", ""))
    ssh = [*ssh_base(host, opts.timeout, opts.ssh_port), query]
    return first_address(run_probe(ssh, "", opts.timeout, dict(env)).stdout) or host


def _master_addr(opts: PreflightOptions, first: HostEntry, env: Mapping[str, str]) -> str:
    """--master_addr, else 127.0.0.1 with --local, else the address the launcher will use."""
    if opts.master_addr:
        return opts.master_addr
    return "127.0.0.1" if opts.local else default_master_addr(first.host, opts, env)


def _probe_request(opts: PreflightOptions, master_addr: str) -> dict:
    """What the probe is asked to look at on every node."""
    return {
        "project_dir": opts.project_dir,
        "code_files": code_files(opts.project_dir),
        "checkpoint_dir": _abs_checkpoint_dir(opts),
        "master": {
            "addr": master_addr,
            "port": opts.master_port,
            "timeout": max(1.0, min(opts.timeout / 3, 10.0)),
        },
    }


def _probe_all(
    opts: PreflightOptions, remote: list[HostEntry], script: str, shell: str, env: dict[str, str]
) -> tuple[ProbeRun, list[ProbeRun]]:
    """Run the probe here and on every remote host at once: (here, each remote host)."""
    with ThreadPoolExecutor(max_workers=min(32, len(remote) + 1)) as pool:
        here = pool.submit(run_probe, ["sh", "-c", shell], script, opts.timeout, env)
        there = [
            pool.submit(
                run_probe,
                [*ssh_base(e.host, opts.timeout, opts.ssh_port), shell],
                script,
                opts.timeout,
            )
            for e in remote
        ]
        return here.result(), [f.result() for f in there]


def run_preflight(opts: PreflightOptions, env: dict[str, str] | None = None) -> PreflightResult:
    """Check every host of the hostfile concurrently (or this machine alone with opts.local).
    Raises ConfigError for bad options or hostfile, GptDsError when the probe cannot run here."""
    env = dict(os.environ if env is None else env)
    entries = _entries(opts)
    opts = dataclasses.replace(opts, project_dir=os.path.abspath(opts.project_dir))
    exports, problems = deepspeed_exports(opts.project_dir, env)
    if opts.local:  # no remote ranks: the local environment is what counts
        exports, problems = {}, []
    master_addr = _master_addr(opts, entries[0], env)
    listen = not (opts.local and opts.node_rank > 0)
    with MasterListener(master_addr, opts.master_port, listen) as listener:
        script = probe_script(_probe_request(opts, master_addr)) + probe_source()
        shell = remote_command(opts.python, exports)
        here, runs = _probe_all(opts, [] if opts.local else entries, script, shell, env)
        local = parse_probe_output(here.stdout)
        if local is None:
            raise GptDsError(
                f"preflight cannot run its probe on this node with {opts.python} "
                f"(exit {here.returncode}): {here.stderr.strip()[-500:]}"
            )
        if opts.local:
            runs = [here]
            if opts.slots is None:
                entries = [HostEntry(entries[0].host, local.get("device_count") or 0, 0)]
        hosts = [
            judge_host(e, run, local, opts, listener) for e, run in zip(entries, runs, strict=True)
        ]
    if opts.local:
        hosts[0].checks["ssh"] = Check(None, "local")
    return PreflightResult(local, hosts, problems, listener.description, master_addr)


def burn_in_command(opts: PreflightOptions, slots: int) -> list[str]:
    """The burn-in's launch: DeepSpeed's own runner over the hostfile (pdsh), or this machine's
    `slots` ranks with --local, running gpt_ds/launch/burn_in.py on every rank."""
    runner = [opts.python, "-u", "-m", "deepspeed.launcher.runner"]
    where = ["--num_gpus", str(slots)] if opts.local else ["--hostfile", str(opts.hostfile)]
    master = ["--master_addr", opts.master_addr] if opts.master_addr else []
    master += ["--master_port", str(opts.master_port)]
    ssh = ["--ssh_port", str(opts.ssh_port)] if opts.ssh_port else []
    program = ["--module", "gpt_ds.launch.burn_in", "--deepspeed_config", opts.burn_in_preset]
    program += ["--model", opts.burn_in_model]
    program += [] if opts.local else ["--hostfile", str(opts.hostfile)]
    return [*runner, *where, *master, *ssh, *program]
