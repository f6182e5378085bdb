"""A process that has imported what a training rank imports, and forks ranks from it.

A rank of the suite's tiny runs spends about 5 of its 8 seconds importing torch, DeepSpeed
(whose ZeRO start-up imports Muon, and with it dynamo and inductor), transformers' GPT-2 and
gpt_ds. The suite launches hundreds of runs; this server imports all of that once and forks
each rank from itself, so a rank starts in milliseconds. The ranks are still separate processes
with their own process group, environment, arguments and standard streams, run from the
script's first line as `python -u script args` would.

node_launcher.py (a lean launch's ranks), harness.launch.run_python (a script) and
harness.launch.Launch (a one-rank lean run) ask it when GPT_DS_TEST_ZYGOTE names its socket (the
suite's conftest starts one per session) and `serving` finds their environment the one this
process imported under; otherwise they start fresh processes.

Protocol, one connection per rank: the client sends one JSON line
`{"argv": [...], "env": {...}, "cwd": "...", "module": bool}` with its stdin, stdout and stderr
attached (SCM_RIGHTS); the server answers `{"pid": N}` once forked and `{"status": S}` (the
exit status as `subprocess` gives it) when the rank is gone. A connection that closes early
(its launcher was killed) takes its rank with it (SIGKILL).

Run as `python -u zygote.py SOCKET`; `python -u zygote.py run SCRIPT args` has it run one
process in the caller's place (harness.launch.Launch's one-rank lean runs). The server must
not start a thread before it forks (nothing it imports does: checked at start-up).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import time
from typing import NoReturn

# What a rank of gpt_ds/train.py imports, whole (its lazy imports included).
PRELOAD = (
    "gpt_ds.train",
    "gpt_ds.training.trainer",
    "gpt_ds.model.training_model",
    "gpt_ds.model.zero3",
    "deepspeed",
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "transformers.models.gpt2.modeling_gpt2",
)
# The variable that names a zygote's socket to the processes that may ask it for ranks.
ZYGOTE_ENV = "GPT_DS_TEST_ZYGOTE"
# Where set, the file node_launcher.py writes its ranks' pids to, a line each, once all
# started: forked ranks are the zygote's children, not the launcher's (harness.launch.Launch).
RANK_PIDS_ENV = "GPT_DS_NODE_LAUNCHER_PIDS"
# Variables read while those modules are imported: a launch that sets them otherwise gets
# fresh processes (`serving` compares them).
IMPORT_ENV_PREFIXES = (
    *("PYTHON", "DS_", "DEEPSPEED", "TORCH", "PYTORCH", "TRANSFORMERS", "HF_"),
    *("OMP_", "KMP_", "MKL_", "LD_", "MALLOC_", "GLIBC_"),  # read as the libraries load
)


def import_env(env: dict[str, str]) -> dict[str, str]:
    """The part of `env` that decides what the preloaded modules did on import."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)}


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise RuntimeError(f"threads after the imports: {threading.enumerate()}: forks unsafe")


def run_script(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -u script args` (or `-m module args`) in the
    request's directory and environment, its streams `fds`, and run it as `__main__`. What the
    script raises (SystemExit included) goes to `exit_as_python_would`."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    target, *args = request["argv"]
    sys.argv = [target, *args]
    if request["module"]:
        sys.path[0] = request["cwd"]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


def exit_as_python_would(script, *args) -> NoReturn:
    """Run `script(*args)`, then end the process as the interpreter ends a script: its
    SystemExit status or traceback, non-daemon threads joined, atexit handlers run, streams
    flushed; but without the interpreter's teardown, which for a heap holding torch,
    DeepSpeed and transformers takes ~1.8 s of every forked process here."""
    try:
        script(*args)
        status = 0
    except SystemExit as e:
        status = system_exit_status(e.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status = -signal.SIGINT  # as CPython: killed by the SIGINT it did not handle
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # what Py_FinalizeEx does first, then atexit, then the flush
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if status == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


def system_exit_status(code: object) -> int:
    """The exit status CPython gives `sys.exit(code)`: None 0, an int itself, anything else
    printed to stderr and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Server:
    """Accepts requests, forks ranks, reports their exits; single-threaded (it forks)."""

    def __init__(self, path: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.rank_of: dict[socket.socket, int] = {}
        self.conn_of: dict[int, socket.socket] = {}
        self.started: dict[int, float] = {}

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select(timeout=0.02):
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    self.client_closed(key.fileobj)
            self.reap()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while not message.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                break
            message += more
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            self.listener.close()
            for other in self.rank_of:
                other.close()
            conn.close()
            exit_as_python_would(run_script, request, fds)
        for fd in fds:
            os.close(fd)
        self.rank_of[conn] = pid
        self.conn_of[pid] = conn
        self.started[pid] = time.monotonic()
        print(f"{time.strftime('%H:%M:%S')} {pid} forked: {' '.join(request['argv'])[:300]}")
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        self.selector.register(conn, selectors.EVENT_READ)

    def client_closed(self, conn: socket.socket) -> None:
        """The launcher hung up (or wrote, which it does not): its rank goes too."""
        pid = self.rank_of.pop(conn)
        self.selector.unregister(conn)
        conn.close()
        if pid in self.conn_of:
            del self.conn_of[pid]
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            del self.started[pid]
            print(f"{time.strftime('%H:%M:%S')} {pid} killed: its launcher hung up")

    def reap(self) -> None:
        while self.conn_of:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn = self.conn_of.pop(pid, None)
            if conn is None:
                continue
            self.rank_of.pop(conn, None)
            self.selector.unregister(conn)
            reply = {"status": os.waitstatus_to_exitcode(status)}
            took = time.monotonic() - self.started.pop(pid)
            print(f"{time.strftime('%H:%M:%S')} {pid} exit {reply['status']} after {took:.1f} s")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.sendall(json.dumps(reply).encode() + b"\n")  # unless its launcher is gone
            conn.close()


class Forked:
    """A process the zygote at `path` forked to run `python -u ARGV` (`-m NAME args` or
    `SCRIPT args`) in `env` and `cwd`, its standard streams `fds` (this process's by default):
    what a launcher uses of a Popen (pid, returncode, wait)."""

    def __init__(self, path: str, argv: list[str], env: dict[str, str], cwd: str, fds=(0, 1, 2)):
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(path)
        module = argv[0] == "-m"
        request = {"argv": argv[module:], "env": env, "cwd": cwd, "module": module}
        socket.send_fds(self.conn, [json.dumps(request).encode() + b"\n"], list(fds))
        self.replies = self.conn.makefile("r")
        self.pid: int = json.loads(self.replies.readline())["pid"]
        self.returncode: int | None = None

    def wait(self) -> int:
        line = self.replies.readline()
        # no reply: the zygote itself died; say so as a killed process would
        self.returncode = json.loads(line)["status"] if line else -signal.SIGKILL
        self.conn.close()
        return self.returncode


def serving(env: dict[str, str], python: str) -> str | None:
    """The socket of the zygote that `env` names (ZYGOTE_ENV) if it can serve a process of
    `python` in `env` (see `refusal`); where it cannot, a line in its `.fresh` log says which
    launch went fresh and why (a test that changed an import-time variable of the suite's own
    process sends every later launch there)."""
    path = env.get(ZYGOTE_ENV)
    if not path or not os.path.exists(path + ".env"):
        return None
    why = refusal(path, env, python)
    if why is None:
        return path
    with open(path + ".fresh", "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} {os.getpid()} {sys.argv[0]}: {why}\n")
    return None


def refusal(path: str, env: dict[str, str], python: str) -> str | None:
    """Why the zygote at `path` cannot serve a process of `python` in `env`, or None."""
    served = read_served(path)
    if served["python"] != python:
        return f"python {python}"
    differ = differing_variables(served, env)
    return "variables " + " ".join(differ) if differ else None


def differing_variables(served: dict, env: dict[str, str]) -> list[str]:
    """The import-time variables of `env` that differ from those the zygote imported under
    (`served`), but for what its imports set themselves where `env` holds that value
    (DeepSpeed sets PYTORCH_NVML_BASED_CUDA_CHECK on import: so has a caller that imported
    it)."""
    mine = import_env(env)
    for name, value in served["set_on_import"].items():
        if mine.get(name) == value:  # as the imports leave it either way: as before them
            if name in served["env"]:
                mine[name] = served["env"][name]
            else:
                del mine[name]
    theirs = served["env"]
    return sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))


def write_pids(path: str, pids: list[int]) -> None:
    """`pids` into `path` (RANK_PIDS_ENV's file) whole or not at all: a reader polling for it
    never sees half."""
    with open(path + ".part", "w") as f:
        f.write("".join(f"{pid}\n" for pid in pids))
    os.replace(path + ".part", path)


def read_pids(path: str) -> list[int]:
    """The pids `write_pids` wrote to `path`, in rank order; none before it has."""
    try:
        with open(path) as f:
            return [int(line) for line in f.read().split()]
    except FileNotFoundError:
        return []


def read_served(path: str) -> dict:
    """What the zygote at `path` serves (`write_served`)."""
    with open(path + ".env") as f:
        return json.load(f)


def main(path: str) -> None:
    server = Server(path)  # listening before the imports: launchers queue meanwhile
    before = import_env(dict(os.environ))
    write_served(path, before, {}, imported=False)  # an exact match is served while the imports run
    preload()
    after = import_env(dict(os.environ))
    set_on_import = {k: v for k, v in after.items() if before.get(k) != v}
    write_served(path, before, set_on_import, imported=True)
    server.serve()


def write_served(
    path: str, env: dict[str, str], set_on_import: dict[str, str], imported: bool
) -> None:
    """What `serving` checks before a launcher asks: this Python, the import environment, and
    what the imports set in it themselves (known once `imported`)."""
    served = {"python": sys.executable, "env": env, "set_on_import": set_on_import}
    with open(path + ".env.tmp", "w") as f:
        json.dump({**served, "imported": imported}, f)
    os.replace(path + ".env.tmp", path + ".env")


def run_in_place(argv: list[str]) -> int:
    """`python -u zygote.py run SCRIPT args`: SCRIPT run by the zygote this environment names,
    in this process's directory, environment and streams, as `python -u SCRIPT args` would:
    SIGTERM and SIGINT passed on, its exit status this process's."""
    path = serving(dict(os.environ), sys.executable)
    if path is None:
        raise SystemExit(f"no zygote serves this environment ({ZYGOTE_ENV})")
    child = Forked(path, argv, dict(os.environ), os.getcwd())
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda n, _: os.kill(child.pid, n))
    status = child.wait()
    if status < 0:  # killed by a signal: so is this process
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    if sys.argv[1] == "run":
        sys.exit(run_in_place(sys.argv[2:]))
    main(sys.argv[1])
