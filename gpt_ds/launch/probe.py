"""What preflight runs on every node, and how it gets there.

`remote_probe` is the program (shipped as source by `probe_script`, its answer read back by
`parse_probe_output`); `deepspeed_exports` and `remote_command` give it the environment
DeepSpeed's runner gives the ranks; `ssh_base` and `run_probe` run it; `MasterListener` stands
in for the master port while the nodes try to reach it.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import re
import shlex
import socket
import subprocess
import threading
from typing import NamedTuple

RESULT_MARK = "GPT_DS_PREFLIGHT_RESULT "
# Variable-name prefixes DeepSpeed's runner copies from the launching shell to every node
# (runner.EXPORT_ENVS + the CUDA/ROCm accelerator's export_envs()).
DS_EXPORT_PREFIXES = ("PYTHON", "MLFLOW", "MV2", "UCX", "NCCL")

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
    }  # type: dict
    proj = req["project_dir"]
    out["project_exists"] = os.path.isdir(proj)
    digests = {}  # type: dict
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
        sock = self._sock
        assert sock is not None  # __enter__ bound it before starting this thread
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
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


def ssh_base(host: str, timeout: float, ssh_port: int | None) -> list[str]:
    """`ssh` to `host` without a password prompt, connecting within `timeout` (at most 15 s)."""
    connect = max(1, int(min(timeout, 15)))
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect}"]
    if ssh_port is not None:
        cmd += ["-p", str(ssh_port)]
    return [*cmd, host]


class ProbeRun(NamedTuple):
    """How one run of the probe ended; returncode -1: no answer within the timeout."""

    returncode: int
    stdout: str
    stderr: str


def run_probe(
    cmd: list[str], script: str, timeout: float, env: dict[str, str] | None = None
) -> ProbeRun:
    """Run `cmd` with the probe `script` on its stdin."""
    try:
        proc = subprocess.run(
            cmd, input=script, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return ProbeRun(-1, "", f"no answer within {timeout:g} s")
    return ProbeRun(proc.returncode, proc.stdout, proc.stderr)
