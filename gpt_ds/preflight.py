"""Check every node of a hostfile before a multi-node launch, and say how to fix what is wrong.

For each host, over `ssh -o BatchMode=yes` (what DeepSpeed's pdsh runner needs: a key, no
password, a known host key), one small Python program runs with the interpreter DeepSpeed will
use there (the launcher's own path, as the pdsh runner does) and the environment the ranks get
(`.deepspeed_env`, PYTHON* variables, PYTHONPATH = the project). It reports:

  ssh        reachable without a password
  project    the project directory exists at the same path, with the same code and configs
  python     same Python version          torch / deepspeed   same versions as here
  devices    GPUs torch sees (or 0/cpu), enough for the hostfile's slots (or --expected_devices)
  master     a TCP connection to the master address works from there (see MasterListener)
  disk       free space and write access at the checkpoint directory

Hosts are checked concurrently, each within --timeout seconds. The result is a table of hosts x
checks and one "fix:" line per failure. Logic only; `tools/preflight.py` is the command line.
"""

from __future__ import annotations

import argparse
import errno
import inspect
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpt_ds.errors import ConfigError, GptDsError
from gpt_ds.hostfile import HostEntry, read_hostfile

CHECKS = ("ssh", "project", "python", "torch", "deepspeed", "devices", "master", "disk")
RESULT_MARK = "GPT_DS_PREFLIGHT_RESULT "
# Variable-name prefixes DeepSpeed's runner copies from the launching shell to every node
# (runner.EXPORT_ENVS + the CUDA/ROCm accelerator's export_envs()).
DS_EXPORT_PREFIXES = ("PYTHON", "MLFLOW", "MV2", "UCX", "NCCL")
DEFAULT_MASTER_PORT = 29500  # DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT


@dataclass
class PreflightOptions:
    """What to check. Paths are as every node sees them (DeepSpeed needs identical paths)."""

    hostfile: str | None = None  # None with local=True
    local: bool = False  # check this machine only, no ssh (single node, or --no_ssh launches)
    slots: int | None = None  # ranks on this machine with local=True (default: its GPUs)
    node_rank: int = 0  # with local=True in a --no_ssh launch: only node 0 hosts the master
    master_addr: str | None = None  # default: the first host, as DeepSpeed's runner picks
    master_port: int = DEFAULT_MASTER_PORT
    expected_devices: int | None = None  # GPUs per node; default: at least the host's slots
    checkpoint_dir: str = "out"  # relative paths are inside project_dir
    min_free_gb: float = 20.0
    ssh_port: int | None = None  # like `deepspeed --ssh_port`; default: ~/.ssh/config or 22
    timeout: float = 30.0  # per host, ssh connection and remote checks together
    python: str = sys.executable  # the interpreter the ranks run (DeepSpeed: the launcher's)
    project_dir: str = field(default_factory=os.getcwd)  # DeepSpeed `cd`s here on every node


@dataclass
class Check:
    """One cell: passed (True), failed (False) or not run (None), a short text, and a fix."""

    ok: bool | None
    text: str = ""
    fix: str = ""


@dataclass
class HostReport:
    host: str
    slots: int
    checks: dict[str, Check] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks.values())


# ----------------------------------------------------------------------------------------------
# The program that runs on every node. Shipped as source: standard library only, no annotations,
# nothing from this module's globals, Python 3.6+ syntax (a node may have an older Python).


def remote_probe(req):
    import hashlib
    import importlib
    import os
    import platform
    import shutil
    import socket
    import sys

    out = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "hostname": socket.gethostname(),
    }
    proj = req["project_dir"]
    out["project_exists"] = os.path.isdir(proj)
    digests = {}
    for rel in req["code_files"]:
        try:
            with open(os.path.join(proj, rel), "rb") as f:
                digests[rel] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            digests[rel] = None
    out["code"] = digests
    for name in ("torch", "deepspeed"):
        try:
            from importlib import metadata

            out[name] = metadata.version(name)
        except Exception as exc:  # not installed, or Python < 3.8
            out[name] = None
            out[name + "_error"] = type(exc).__name__ + ": " + str(exc)
    try:
        torch = importlib.import_module("torch")
        out["device_count"] = torch.cuda.device_count()
        hip = getattr(torch.version, "hip", None)
        out["device_kind"] = "rocm" if hip else ("cuda" if out["device_count"] else "cpu")
    except Exception as exc:
        out["device_count"] = None
        out["device_error"] = type(exc).__name__ + ": " + str(exc)
    master = req.get("master")
    if master:
        try:
            socket.create_connection((master["addr"], master["port"]), timeout=master["timeout"])
            out["master"] = "ok"
        except Exception as exc:
            out["master"] = type(exc).__name__ + ": " + str(exc)
    ck = req.get("checkpoint_dir")
    if ck:
        path = ck
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        out["disk_path"] = path
        out["disk_free"] = shutil.disk_usage(path).free
        out["disk_writable"] = os.access(path, os.W_OK)
    return out


def probe_script(req: dict) -> str:
    """Python source that runs `remote_probe(req)` and prints its result on one marked line."""
    return (
        inspect.getsource(remote_probe)
        + "\nimport json\n"
        + f"print({RESULT_MARK!r} + json.dumps(remote_probe(json.loads({json.dumps(req)!r}))))\n"
    )


def parse_probe_output(stdout: str) -> dict | None:
    """The probe's result: the last marked line (login banners and rc files may print too)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    return None


# ----------------------------------------------------------------------------------------------
# The environment DeepSpeed's runner gives remote ranks.


def read_deepspeed_env(project_dir: str, env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Variables from `.deepspeed_env` (or $DS_ENV_FILE) in ~ then the project dir, as DeepSpeed
    reads them, and the problems that would crash or confuse its runner."""
    name = env.get("DS_ENV_FILE", ".deepspeed_env")
    exports: dict[str, str] = {}
    problems: list[str] = []
    seen: set[str] = set()
    for base in (os.path.expanduser("~"), project_dir):
        path = os.path.join(base, name)
        if not os.path.isfile(path) or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if "=" not in line:
                    problems.append(
                        f"{path} line {lineno}: {line.strip()!r} has no '=': DeepSpeed's runner "
                        "crashes on it (blank and comment lines are not allowed); remove it"
                    )
                elif line.lstrip().startswith("#"):
                    problems.append(
                        f"{path} line {lineno}: comments are not supported: DeepSpeed exports "
                        "the line as is and the '#' comments out the rest of the remote command"
                    )
                else:
                    key, val = line.split("=", 1)
                    exports[key.strip()] = val.strip()
    return exports, problems


def deepspeed_exports(project_dir: str, env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What `deepspeed --hostfile` exports on every node, and problems with `.deepspeed_env`."""
    exports = {k: v for k, v in env.items() if k.startswith(DS_EXPORT_PREFIXES)}
    pp = env.get("PYTHONPATH")
    exports["PYTHONPATH"] = project_dir + (":" + pp if pp else "")
    file_exports, problems = read_deepspeed_env(project_dir, env)
    exports.update(file_exports)
    return exports, problems


def ds_quote(value: str) -> str:
    """A value quoted as DeepSpeed's `MultiNodeRunner.add_export` does: in double quotes when
    it has anything beyond `[\\w@%+=:,./-]`, so `$VAR` in `.deepspeed_env` expands remotely."""
    value = value.strip()
    return f'"{value}"' if re.search(r"[^\w@%+=:,./-]", value) else value


def remote_command(python: str, exports: dict[str, str]) -> str:
    """The shell command run on a node: the exports, then the interpreter reading stdin."""
    parts = [f"export {k}={ds_quote(v)};" for k, v in exports.items()]
    return " ".join([*parts, "exec", shlex.quote(python), "-"])


# ----------------------------------------------------------------------------------------------
# Master address and port.


class MasterListener:
    """Stands in for the master port while the nodes try to connect to it.

    Before launch nothing listens there. If the master address is this machine, bind the port
    on all interfaces (as torch's TCP store will) and accept: a node's connection then proves
    address, route, firewall and port; a failure to bind means the port is taken. If the master
    is another machine, nodes still connect to the master port: "connection refused" there
    proves the address routes (the port opens at launch), a timeout means it does not.
    """

    def __init__(self, addr: str, port: int, listen: bool = True):
        self.addr, self.port = addr, port
        self.local = listen and is_local_address(addr)
        self.error: str | None = None
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MasterListener:
        if not self.local:
            return self
        family = socket.AF_INET6 if ":" in self.addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", self.port))
        except OSError as exc:
            sock.close()
            taken = exc.errno == errno.EADDRINUSE
            self.error = "port in use here" if taken else f"cannot bind: {exc.strerror}"
            return self
        sock.listen(64)
        sock.settimeout(0.2)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
                conn.close()
            except TimeoutError:
                continue
            except OSError:
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        if self._sock:
            self._sock.close()

    @property
    def description(self) -> str:
        where = "this node" if self.local else "another node: port opens at launch"
        return f"{self.addr}:{self.port} ({where})"


def is_local_address(addr: str) -> bool:
    """Whether `addr` (a name or an IP) is an address of this machine."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], 0))
                return True
            except OSError:
                continue
    return False


# ----------------------------------------------------------------------------------------------
# Running the probe.


def ssh_base(host: str, opts: PreflightOptions) -> list[str]:
    connect = max(1, int(min(opts.timeout, 15)))
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect}"]
    if opts.ssh_port is not None:
        cmd += ["-p", str(opts.ssh_port)]
    return [*cmd, host]


def run_probe(
    cmd: list[str], script: str, timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); returncode -1 on timeout."""
    try:
        proc = subprocess.run(
            cmd, input=script, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return -1, "", f"no answer within {timeout:g} s"
    return proc.returncode, proc.stdout, proc.stderr


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


def _code_check(remote: dict, local: dict, project_dir: str, host: str) -> Check:
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


def _version_check(name: str, remote: dict, local: dict, host: str, python: str) -> Check:
    here, there = local.get(name), remote.get(name)
    if there is None:
        return Check(False, "not installed", f"install {name}=={here} on {host} for {python}")
    if there != here:
        fix = f"{name} {there} on {host} but {here} here: install the same version everywhere"
        if name == "python":
            fix += f" (the ranks run {python} on every node)"
        else:
            fix += f": {python} -m pip install {name}=={here.split('+')[0]}"
            if name == "torch" and "+" in here:
                fix += f" (the {here.split('+')[1]} build)"
        return Check(False, f"{there} != {here}", fix)
    return Check(True, there)


def _devices_check(remote: dict, local: dict, slots: int, expected: int | None, host: str) -> Check:
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


def _master_check(remote: dict, listener: MasterListener, host: str) -> Check:
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
        "set NET_IF (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME) to that network's interface",
    )


def _disk_check(remote: dict, min_free_gb: float, ckpt: str, host: str) -> Check:
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


def judge_host(
    entry: HostEntry,
    rc: int,
    stdout: str,
    stderr: str,
    local: dict,
    opts: PreflightOptions,
    listener: MasterListener,
) -> HostReport:
    """Turn one host's probe result into its row of checks."""
    report = HostReport(entry.host, entry.slots, {name: Check(None) for name in CHECKS})
    host, checks = entry.host, report.checks
    if rc == -1 or rc == 255:
        checks["ssh"] = ssh_failure(host, rc, stderr)
        return report
    checks["ssh"] = Check(True, "ok")
    remote = parse_probe_output(stdout)
    if remote is None:
        tail = (stderr.strip().splitlines() or [f"exit code {rc}"])[-1]
        missing = rc == 127 or "No such file" in stderr
        checks["python"] = Check(
            False,
            "not found" if missing else "probe failed",
            f"{opts.python} {'does not exist' if missing else 'fails'} on {host} ({tail}): "
            "install the same environment at the same path on every node",
        )
        return report
    checks["project"] = _code_check(remote, local, opts.project_dir, host)
    for name in ("python", "torch", "deepspeed"):
        checks[name] = _version_check(name, remote, local, host, opts.python)
    checks["devices"] = _devices_check(remote, local, entry.slots, opts.expected_devices, host)
    checks["master"] = _master_check(remote, listener, host)
    ckpt = _abs_checkpoint_dir(opts)
    checks["disk"] = _disk_check(remote, opts.min_free_gb, ckpt, host)
    return report


# ----------------------------------------------------------------------------------------------
# The whole check.


def _abs_checkpoint_dir(opts: PreflightOptions) -> str:
    return os.path.normpath(os.path.join(opts.project_dir, opts.checkpoint_dir))


def code_files(project_dir: str) -> list[str]:
    """The files every node must have identical: the package and the DeepSpeed presets."""
    root = Path(project_dir)
    files = [*root.glob("gpt_ds/**/*.py"), *root.glob("ds_configs/*.json")]
    return sorted(str(p.relative_to(root)) for p in files if "__pycache__" not in p.parts)


@dataclass
class PreflightResult:
    local: dict
    reports: list[HostReport]
    problems: list[str]  # not tied to one host (e.g. a bad .deepspeed_env)
    master: str

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.ok for r in self.reports)


def run_preflight(opts: PreflightOptions, env: dict[str, str] | None = None) -> PreflightResult:
    """Check every host of the hostfile concurrently (or this machine alone with opts.local).
    Raises ConfigError for bad options or hostfile, GptDsError when the probe cannot run here."""
    env = dict(os.environ if env is None else env)
    if opts.local:
        entries = [HostEntry(socket.gethostname(), opts.slots or 0, 0)]
    elif opts.hostfile:
        entries = read_hostfile(opts.hostfile)
    else:
        raise ConfigError("give --hostfile HOSTFILE, or --local to check this machine only")
    opts.project_dir = os.path.abspath(opts.project_dir)
    exports, problems = deepspeed_exports(opts.project_dir, env)
    if opts.local:  # no remote ranks: the local environment is what counts
        exports, problems = {}, []
    files = code_files(opts.project_dir)
    req = {
        "project_dir": opts.project_dir,
        "code_files": files,
        "checkpoint_dir": _abs_checkpoint_dir(opts),
    }
    master_addr = opts.master_addr or ("127.0.0.1" if opts.local else entries[0].host)
    listen = not (opts.local and opts.node_rank > 0)
    with MasterListener(master_addr, opts.master_port, listen) as listener:
        req["master"] = {
            "addr": master_addr,
            "port": opts.master_port,
            "timeout": max(1.0, min(opts.timeout / 3, 10.0)),
        }
        script = probe_script(req)
        shell = remote_command(opts.python, exports)
        remote = [] if opts.local else entries
        with ThreadPoolExecutor(max_workers=min(32, len(remote) + 1)) as pool:
            local_run = pool.submit(run_probe, ["sh", "-c", shell], script, opts.timeout, env)
            futures = [
                pool.submit(run_probe, [*ssh_base(e.host, opts), shell], script, opts.timeout)
                for e in remote
            ]
            local_result = local_run.result()
            local = parse_probe_output(local_result[1])
            if local is None:
                raise GptDsError(
                    f"preflight cannot run its probe on this node with {opts.python} "
                    f"(exit {local_result[0]}): {local_result[2].strip()[-500:]}"
                )
            if opts.local:
                results = [local_result]
                if opts.slots is None:
                    entries = [HostEntry(entries[0].host, local.get("device_count") or 0, 0)]
            else:
                results = [f.result() for f in futures]
            reports = [
                judge_host(e, *r, local, opts, listener)
                for e, r in zip(entries, results, strict=True)
            ]
    if opts.local:
        reports[0].checks["ssh"] = Check(None, "local")
    return PreflightResult(local, reports, problems, listener.description)


# ----------------------------------------------------------------------------------------------
# Output.


def _marks() -> tuple[str, str, str]:
    enc = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "✓✗–".encode(enc)
        return "✓", "✗", "–"
    except (UnicodeEncodeError, LookupError):
        return "ok", "X", "-"


def format_report(result: PreflightResult) -> str:
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
    for r in result.reports:
        cells = [r.host, str(r.slots)]
        for name in CHECKS:
            c = r.checks.get(name, Check(None))
            mark = skip if c.ok is None else (yes if c.ok else no)
            cells.append(f"{mark} {c.text}".strip())
        rows.append(cells)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    fixes = [f"fix: {p}" for p in result.problems]
    for r in result.reports:
        fixes += [f"fix: {r.host} {n}: {c.fix}" for n, c in r.checks.items() if c.ok is False]
    lines.append("")
    if fixes:
        lines += fixes
        failed = sum(not r.ok for r in result.reports)
        lines.append(f"preflight: {failed} of {len(result.reports)} hosts failed")
    else:
        n = len(result.reports)
        lines.append(f"preflight: {'all ' + str(n) + ' hosts' if n > 1 else 'this host is'} ready")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tools/preflight.py",
        description="Check every node of a DeepSpeed hostfile before launching: ssh, project "
        "path and code, Python/torch/deepspeed versions, devices, master reachability, disk.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hostfile", help="DeepSpeed hostfile (HOST slots=N lines)")
    where.add_argument(
        "--local",
        action="store_true",
        help="check this machine only, no ssh (single node, or one node of a --no_ssh launch)",
    )
    p.add_argument("--slots", type=int, help="with --local: ranks on this machine")
    p.add_argument(
        "--node_rank",
        type=int,
        default=0,
        help="with --local, in a --no_ssh launch: this node's rank (only node 0 binds the "
        "master port; the others check that they can reach it)",
    )
    p.add_argument(
        "--master_addr", help="master address (default: the hostfile's first host; 127.0.0.1)"
    )
    p.add_argument("--master_port", type=int, default=DEFAULT_MASTER_PORT, help="master port")
    p.add_argument(
        "--expected_devices", type=int, help="GPUs every node must see (default: >= its slots)"
    )
    p.add_argument(
        "--checkpoint_dir", default="out", help="the run's --out_dir (relative: in the project)"
    )
    p.add_argument("--min_free_gb", type=float, default=20.0, help="free disk needed there")
    p.add_argument("--ssh_port", type=int, help="ssh port (as `deepspeed --ssh_port`)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per host")
    p.add_argument(
        "--python", default=sys.executable, help="interpreter the ranks run (default: this one)"
    )
    p.add_argument(
        "--project_dir", default=os.getcwd(), help="project path on every node (default: cwd)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """0: every host ready; 1: some check failed (fix: lines printed); 2: bad input."""
    args = build_parser().parse_args(argv)
    opts = PreflightOptions(**vars(args))
    try:
        result = run_preflight(opts)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except GptDsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(result), flush=True)
    return 0 if result.ok else 1
