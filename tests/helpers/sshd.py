"""Two (or more) "nodes" on one machine: sshd bound to loopback addresses, for multi-node tests.

`sshd_fixture()` makes a session fixture giving a `SshLoopback`: a private sshd on a free port,
listening on 127.0.0.1 and 127.0.0.2 only, with its own host key, a fresh client key in a temp
dir as its only authorized key (root may log in by key), and a block in `~/.ssh/config` (the
file ssh, pdsh and DeepSpeed's runner read) mapping those addresses to that port and key, with
host-key checking off. DeepSpeed's pdsh runner then works unchanged: it runs
`pdsh -S -f 1024 -w 127.0.0.1,127.0.0.2 ...` with PDSH_RCMD_TYPE=ssh, and pdsh runs the
`ssh` binary, which applies `~/.ssh/config` (port, key) because no `--ssh_port` is given.

At the end the sshd processes are stopped by pid and the config block is removed (only ours:
it is fenced by markers carrying our pid; blocks left by a killed run are removed too).
Missing `openssh-server` / `pdsh` are installed with apt-get (needs root). All of it only with
GPT_DS_TEST_SYSTEM=1 (helpers/system.py); without it, or when this machine cannot do it (not
root, no apt, no 127.0.0.2), the tests are skipped with the reason.
"""

from __future__ import annotations

import atexit
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.launch import free_port

from helpers.system import Unavailable, check_allowed, ensure_packages, machine_lock

SSHD = "/usr/sbin/sshd"
PACKAGES = {SSHD: "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client",
            "pdsh": "pdsh"}  # fmt: skip
NODES = ("127.0.0.1", "127.0.0.2")
# The fence keeps this file's old name: blocks left by killed runs of earlier versions still match.
_BEGIN = "# >>> gpt_ds tests/sshd_loopback.py pid={pid} >>>"
_END = "# <<< gpt_ds tests/sshd_loopback.py pid={pid} <<<"
_BLOCK_RE = re.compile(
    r"# >>> gpt_ds tests/sshd_loopback\.py pid=(\d+) >>>\n.*?"
    r"# <<< gpt_ds tests/sshd_loopback\.py pid=\1 <<<\n?",
    re.S,
)


def ssh_config_path() -> Path:
    """The client config ssh reads: in the passwd home directory (ssh ignores $HOME)."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "config"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Sshd:
    """One running sshd: its addresses, port, process and log file."""

    addresses: tuple[str, ...]
    port: int
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, 9)
                self.proc.wait(timeout=10)


@dataclass
class SshLoopback:
    """Loopback "nodes" reachable with `ssh ADDR` (and pdsh) through ~/.ssh/config."""

    workdir: Path
    key: Path = field(init=False)
    ports: dict[str, int] = field(default_factory=dict)  # address -> port in our config block
    daemons: list[Sshd] = field(default_factory=list)
    _closed: bool = False
    _made_ssh_dir: bool = False

    def __post_init__(self) -> None:
        self.key = self.workdir / "id_ed25519"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpt_ds-tests", "-f",
              str(self.key)])  # fmt: skip
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
              str(self.workdir / "ssh_host_ed25519_key")])  # fmt: skip
        (self.workdir / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.daemons[0].addresses if self.daemons else ()

    def start_sshd(
        self, addresses: tuple[str, ...] = NODES, bind_mounts: dict[str, str] | None = None
    ) -> Sshd:
        """An sshd listening on `addresses` only. `bind_mounts` {source: target} are mounted
        (read-only) in a private mount namespace for that sshd and its sessions alone: a node
        that sees different files at the same paths, as a real other machine would."""
        port = free_port()
        name = "sshd_" + "_".join(a.replace(".", "-") for a in addresses)
        conf = self.workdir / f"{name}.conf"
        conf.write_text(
            "\n".join(
                [f"Port {port}", *(f"ListenAddress {a}" for a in addresses)]
                + [
                    f"HostKey {self.workdir / 'ssh_host_ed25519_key'}",
                    f"PidFile {self.workdir / name}.pid",
                    f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # the key file lives under /tmp (world-writable parent)
                    "PrintMotd no",
                    "MaxStartups 100:30:200",  # pdsh and preflight connect all at once
                    "LogLevel VERBOSE",
                ]
            )
            + "\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        check = subprocess.run([SSHD, "-t", "-f", str(conf)], capture_output=True, text=True)
        if check.returncode != 0:
            raise Unavailable(f"sshd rejects its config: {check.stderr.strip()}")
        cmd = [SSHD, "-D", "-e", "-f", str(conf)]
        if bind_mounts:
            if not shutil.which("unshare"):
                raise Unavailable("no `unshare` for a per-node mount namespace")
            mounts = " && ".join(
                f"mount --bind {src!s} {dst!s} && mount -o remount,bind,ro {dst!s}"
                for src, dst in bind_mounts.items()
            )
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f"{mounts} && exec {' '.join(cmd)}"]  # fmt: skip
        log = self.workdir / f"{name}.log"
        with open(log, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        daemon = Sshd(tuple(addresses), port, proc, log)
        self.daemons.append(daemon)
        self._wait_listening(daemon)
        for a in addresses:
            self.ports[a] = port
        self._write_config()
        return daemon

    def stop_sshd(self, daemon: Sshd) -> None:
        """Stop one sshd started here and drop its addresses from the config block."""
        daemon.stop()
        for a in daemon.addresses:
            if self.ports.get(a) == daemon.port:
                del self.ports[a]
        self._write_config()

    def dead_address(self, address: str) -> int:
        """Route `ssh address` to a port where nothing listens (an unreachable node)."""
        self.ports[address] = free_port()
        self._write_config()
        return self.ports[address]

    def _wait_listening(self, daemon: Sshd, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        pending = list(daemon.addresses)
        while pending and time.monotonic() < deadline:
            if daemon.proc.poll() is not None:
                break
            try:
                with socket.create_connection((pending[0], daemon.port), timeout=1):
                    pending.pop(0)
            except OSError:
                time.sleep(0.1)
        if pending:
            daemon.stop()
            raise Unavailable(
                f"sshd did not listen on {pending[0]}:{daemon.port} "
                f"(exit {daemon.proc.poll()}): {daemon.log.read_text()[-800:]}"
            )

    # ~/.ssh/config ----------------------------------------------------------------------------

    def config_block(self) -> str:
        by_port: dict[int, list[str]] = {}
        for addr, port in self.ports.items():
            by_port.setdefault(port, []).append(addr)
        lines = [_BEGIN.format(pid=os.getpid())]
        for port, addrs in by_port.items():
            lines += [
                f"Host {' '.join(addrs)}",
                f"    Port {port}",
                f"    IdentityFile {self.key}",
                "    IdentitiesOnly yes",
                "    StrictHostKeyChecking no",
                "    UserKnownHostsFile /dev/null",
                "    LogLevel ERROR",
            ]
        lines += ["Host *", _END.format(pid=os.getpid())]  # `Host *`: what follows stays global
        return "\n".join(lines) + "\n"

    def _edit_config(self, new_block: str) -> None:
        """Replace our block (and blocks of dead test runs) with `new_block`, at the top: ssh
        uses the first value it finds, so ours must precede the user's `Host *` defaults."""
        path = ssh_config_path()
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700)
            self._made_ssh_dir = True
        with machine_lock("ssh_config"):
            text = path.read_text() if path.exists() else ""

            def keep(m: re.Match) -> str:
                pid = int(m.group(1))
                return m.group(0) if pid != os.getpid() and _pid_alive(pid) else ""

            text = _BLOCK_RE.sub(keep, text)
            text = new_block + text
            if text:
                tmp = path.with_name(path.name + f".tmp{os.getpid()}")
                tmp.write_text(text)
                os.chmod(tmp, 0o600)
                os.replace(tmp, path)
            elif path.exists():
                path.unlink()
            if not text and self._made_ssh_dir and not any(path.parent.iterdir()):
                path.parent.rmdir()  # we made ~/.ssh for this block: leave no trace

    def _write_config(self) -> None:
        self._edit_config(self.config_block())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for d in self.daemons:
            d.stop()
        self._edit_config("")
        shutil.rmtree(self.workdir, ignore_errors=True)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Unavailable(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")


def _start() -> SshLoopback:
    check_allowed("the loopback sshd (a block in ~/.ssh/config; apt-get of missing ssh, pdsh)")
    if os.geteuid() != 0:
        raise Unavailable("not root: the test sshd logs in as this user and needs /run/sshd")
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError as exc:
        raise Unavailable(f"cannot bind 127.0.0.2 (no 127.0.0.0/8 loopback): {exc}") from exc
    ensure_packages(PACKAGES)
    loop = SshLoopback(Path(tempfile.mkdtemp(prefix="gpt_ds_sshd_")))
    atexit.register(loop.close)  # even if pytest dies before teardown
    try:
        loop.start_sshd(NODES)
        probe = subprocess.run(
            ["ssh", "-o", "BatchMode=yes", NODES[1], "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            raise Unavailable(f"`ssh {NODES[1]} true` fails through the test sshd: {probe.stderr}")
    except BaseException:
        loop.close()
        raise
    return loop


_shared: SshLoopback | None = None
_failure: str | None = None


def shared_loopback() -> SshLoopback:
    """The process-wide instance (one sshd and one config block for every test module);
    pytest.skip with the reason when this machine cannot provide it."""
    global _shared, _failure
    if _shared is not None and _shared._closed:
        _shared = None
    if _shared is None and _failure is None:
        try:
            _shared = _start()
        except Unavailable as exc:
            _failure = str(exc)
    if _failure is not None:
        pytest.skip(f"loopback sshd unavailable: {_failure}")
    return _shared


def sshd_fixture(name: str = "ssh_loopback"):
    """A session fixture `name` yielding the shared `SshLoopback`. In a test module:
    `ssh_loopback = sshd_fixture()`, then take `ssh_loopback` as a test argument."""

    @pytest.fixture(scope="session", name=name)
    def _fixture():
        loop = shared_loopback()
        yield loop
        loop.close()

    return _fixture


def probe_records(stdout: str) -> list[dict]:
    """The JSON record each rank printed after "PROBE ": read from each marker on, not line by
    line, since a launcher forwarding two ranks' output (mpirun) can put both on one line."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(part)[0] for part in stdout.split("PROBE ")[1:]]
