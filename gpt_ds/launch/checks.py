"""Preflight's verdicts: one node's probe result against this node's, cell by cell, and the table.

Each `*_check` function turns part of a probe result (see `gpt_ds.launch.probe`) into a
`Check`: passed, failed with a `fix`, or not run. `format_result` prints a `PreflightResult` as
a table of hosts x `CHECKS` and one `fix:` line per failure.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from gpt_ds.launch.gpu_support import GpuFacts, gpu_problems
from gpt_ds.launch.probe import MasterListener

CHECKS = ("ssh", "project", "python", "torch", "deepspeed", "devices", "master", "disk")


@dataclass
class Check:
    """One cell: passed (True), failed (False) or not run (None), a short text, and a fix."""

    ok: bool | None
    text: str = ""
    fix: str = ""


@dataclass
class HostChecks:
    """One host's row of the table: its slots and a `Check` per column of `CHECKS`."""

    host: str
    slots: int
    checks: dict[str, Check] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks.values())


@dataclass
class PreflightResult:
    local: dict
    hosts: list[HostChecks]
    problems: list[str]  # not tied to one host (e.g. a bad .deepspeed_env)
    master: str  # address:port and where it listens, for the table
    master_addr: str = ""  # the address checked: the burn-in launches with it

    @property
    def ok(self) -> bool:
        return not self.problems and all(h.ok for h in self.hosts)


# ----------------------------------------------------------------------------------------------
# ssh.


SSH_FAILURES = (
    ("Permission denied", "key refused (password login only?)",
     "copy your key: ssh-copy-id {host}; DeepSpeed's pdsh runner logs in without a password"),
    ("Host key verification failed", "host key unknown",
     "ssh {host} once interactively, or: ssh-keyscan -H {host} >> ~/.ssh/known_hosts"),
    ("Connection refused", "connection refused",
     "start sshd on {host}, or give its port: --ssh_port (and `deepspeed --ssh_port`) or a "
     "'Port' line for it in ~/.ssh/config"),
    ("Could not resolve hostname", "unknown host name",
     "add {host} to /etc/hosts or DNS on this node, or use its IP address in the hostfile"),
    ("timed out", "connection timed out",
     "{host} is down or a firewall drops ssh; check the address and that sshd runs"),
    ("No route to host", "no route to host",
     "{host} is not reachable from this node: check the address and the network"),
)  # fmt: skip


def ssh_failure(host: str, rc: int, stderr: str) -> Check:
    if rc == -1:
        return Check(
            False,
            "timeout",
            f"{host} did not answer over ssh in time ({stderr}): check that it is up, or raise "
            "--timeout if importing torch is slow there (cold caches, network file systems)",
        )
    for needle, text, fix in SSH_FAILURES:
        if needle.lower() in stderr.lower():
            return Check(False, text, fix.format(host=host))
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"ssh exit code {rc}"
    return Check(False, "ssh failed", f"`ssh {host} true` fails: {last}")


# ----------------------------------------------------------------------------------------------
# Judging one host against this one.


def code_check(remote: dict, local: dict, project_dir: str, host: str) -> Check:
    if not remote.get("project_exists"):
        return Check(
            False,
            "missing",
            f"{project_dir} does not exist on {host}: clone the project to the same path on "
            "every node (or mount it there); DeepSpeed runs `cd {project_dir}` on each node",
        )
    differ = [p for p, d in local["code"].items() if remote["code"].get(p) != d]
    if differ:
        names = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        return Check(
            False,
            f"{len(differ)} files differ",
            f"code or configs on {host} differ from here ({names}): sync the checkout "
            "(git pull / rsync) on every node",
        )
    return Check(True, "same code")


def version_check(name: str, remote: dict, local: dict, host: str, python: str) -> Check:
    here, there = local.get(name), remote.get(name)
    if there is None:
        return Check(False, "not installed", f"install {name}=={here} on {host} for {python}")
    if there != here:
        fix = f"{name} {there} on {host} but {here} here: install the same version everywhere"
        if name == "python":
            fix += f" (the ranks run {python} on every node)"
        else:
            assert here is not None  # torch, deepspeed: dependencies of the gpt_ds running here
            fix += f": {python} -m pip install {name}=={here.split('+')[0]}"
            if name == "torch" and "+" in here:
                fix += f" (the {here.split('+')[1]} build)"
        return Check(False, f"{there} != {here}", fix)
    return Check(True, there)


def devices_check(remote: dict, local: dict, slots: int, expected: int | None, host: str) -> Check:
    count, kind = remote.get("device_count"), remote.get("device_kind", "cpu")
    if count is None:
        err = remote.get("device_error")
        return Check(False, "torch fails", f"importing torch on {host} fails: {err}")
    text = f"{count} {kind}" if count else "0/cpu"
    if expected is not None and count != expected:
        return Check(
            False,
            f"{text} != {expected}",
            f"{host} sees {count} GPUs, {expected} expected: check the driver, "
            "CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES and (Docker) --gpus all, or for ROCm "
            "--device /dev/kfd --device /dev/dri",
        )
    if count == 0 and local.get("device_count"):
        return Check(
            False,
            "no GPU",
            f"{host} sees no GPU while this node sees {local['device_count']}: a CPU torch "
            "build, a missing driver, or a container started without GPU access",
        )
    if 0 < count < slots:
        return Check(
            False,
            f"{count} < slots={slots}",
            f"{host} has {count} GPUs but the hostfile says slots={slots}: lower slots "
            "or use --include/--exclude",
        )
    return Check(True, text)


def gpu_check(devices: Check, facts: GpuFacts | None) -> Check:
    """The devices cell, failed when the node's GPUs cannot be trained on as they are: a driver
    too old for torch's CUDA, a card the wheel has no kernels for, DeepSpeed falling back to
    CPU (gpt_ds.launch.gpu_support). Facts the probe could not gather leave the cell as it was."""
    problems = gpu_problems(facts) if facts is not None and devices.ok is not False else []
    if not problems:
        return devices
    assert facts is not None  # the problems are the facts'
    text = "GPU unusable" if facts.cuda_available else "GPU unseen"
    return Check(False, text, "; and ".join(problems))


def master_check(remote: dict, listener: MasterListener, host: str) -> Check:
    if listener.error:
        return Check(
            False,
            listener.error,
            f"port {listener.port} on {listener.addr}: {listener.error}: pick a free "
            "--master_port (or stop the old run that holds it)",
        )
    result = remote.get("master")
    if result == "ok":
        return Check(True, "reachable")
    if not listener.local and str(result).startswith("ConnectionRefusedError"):
        return Check(True, "routable")  # the master answered; its port opens at launch
    return Check(
        False,
        "unreachable",
        f"{host} cannot connect to {listener.addr}:{listener.port}: {result}. Use a master "
        "address the nodes can route to (--master_addr), open the port in the firewall, and "
        "set GPT_DS_NET_IF (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME) to that network's interface",
    )


def disk_check(remote: dict, min_free_gb: float, ckpt: str, host: str) -> Check:
    free_gb = remote["disk_free"] / 1e9
    text = f"{free_gb:.0f} GB free" if free_gb >= 10 else f"{free_gb:.1f} GB free"
    if not remote["disk_writable"]:
        return Check(
            False,
            "not writable",
            f"{remote['disk_path']} on {host} is not writable: fix permissions or choose "
            "another --out_dir / --checkpoint_dir (same path on every node)",
        )
    if free_gb < min_free_gb:
        return Check(
            False,
            text,
            f"{ckpt} on {host}: {free_gb:.1f} GB free < {min_free_gb:g} GB: free space or "
            "point --out_dir elsewhere (a ZeRO checkpoint takes 14-16 bytes per parameter)",
        )
    return Check(True, text)


# ----------------------------------------------------------------------------------------------
# Output.


def _marks() -> tuple[str, str, str]:
    enc = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "✓✗–".encode(enc)
        return "✓", "✗", "–"
    except (UnicodeEncodeError, LookupError):
        return "ok", "X", "-"


def format_result(result: PreflightResult) -> str:
    """The local versions, the hosts x checks table, then one `fix:` line per failure."""
    yes, no, skip = _marks()
    loc = result.local
    lines = [
        f"local: python {loc['python']} ({loc['executable']}), torch {loc['torch']}, "
        f"deepspeed {loc['deepspeed']}; master {result.master}",
        "",
    ]
    header = ["host", "slots", *CHECKS]
    rows = []
    for h in result.hosts:
        cells = [h.host, str(h.slots)]
        for name in CHECKS:
            c = h.checks.get(name, Check(None))
            mark = skip if c.ok is None else (yes if c.ok else no)
            cells.append(f"{mark} {c.text}".strip())
        rows.append(cells)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    fixes = [f"fix: {p}" for p in result.problems]
    for h in result.hosts:
        fixes += [f"fix: {h.host} {n}: {c.fix}" for n, c in h.checks.items() if c.ok is False]
    lines.append("")
    if fixes:
        lines += fixes
        failed = sum(not h.ok for h in result.hosts)
        lines.append(f"preflight: {failed} of {len(result.hosts)} hosts failed")
    else:
        n = len(result.hosts)
        lines.append(f"preflight: {'all ' + str(n) + ' hosts' if n > 1 else 'this host is'} ready")
    return "\n".join(lines)
