"""The suite's launches: the runs benchmarks/support/launch.py starts as a user does, started
faster, with the same ranks, arguments and environment.

A rank of the suite's tiny runs spends most of its seconds importing, and the `deepspeed`
command spends ~7 s more in its runner and per-node launcher; the suite launches hundreds of
runs. So `run_deepspeed` starts what that command runs on one node through node_launcher.py,
its ranks forked by the session's zygote.py (`zygote`); `run_python` forks scripts from it;
`Launch` runs in the background through DeepSpeed's per-node launcher alone, or the suite's.
The runner itself is started where it is what a test is about (a hostfile, --include, signals
to it). Tests import `run_deepspeed`, `run_python` and `Launch` from here, never support's
(tests/test_layout.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import support.faults
import support.launch
from support.launch import REPO, TRAIN, checked, free_port, launch_env, run_launch

from harness.zygote import RANK_PIDS_ENV, ZYGOTE_ENV, Forked, read_pids, serving

NODE_LAUNCHER = Path(__file__).with_name("node_launcher.py")
ZYGOTE = Path(__file__).with_name("zygote.py")
# --max_iters of conftest's `stage_run`: one run per ZeRO stage per session
STAGE_RUN_ITERS = 24


@contextlib.contextmanager
def zygote(folder: Path) -> Iterator[None]:
    """A zygote.py for this process's launches, while the context lasts: their lean node
    launchers (`node_launch(..., lean=True)`), `run_python` and one-rank lean `Launch` runs
    have it fork their processes from one that imported a rank's modules once, instead of
    each process importing them (~6 s a launch).
    Started in the background: it imports while the first tests run."""
    socket_path = folder / "zygote.sock"
    env = checkout_first(launch_env())
    log = (folder / "zygote.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-u", str(ZYGOTE), str(socket_path)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    os.environ[ZYGOTE_ENV] = str(socket_path)
    try:
        yield
    finally:
        del os.environ[ZYGOTE_ENV]
        server.kill()
        server.wait()
        log.close()


def run_deepspeed(
    args: list[str],
    num_gpus: int = 2,
    script: Path | str = TRAIN,
    timeout: float = 600,
    check: bool = True,
    extra_launcher_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """`deepspeed --num_gpus N script args...` on localhost with a fresh port; output captured.
    Runs what that command runs on one node, through node_launcher.py (DeepSpeed's per-node
    launcher without its start-up), unless `extra_launcher_args` asks for the runner (a
    hostfile, --include, ...): support.launch.run_deepspeed. `fresh`: ranks that import for
    themselves, not forked by the suite's zygote (a test of what a user's fresh process
    holds)."""
    if fresh:
        env = {k: v for k, v in (env or launch_env()).items() if k != ZYGOTE_ENV}
    launcher_args = extra_launcher_args or []
    if not set(launcher_args) <= {"--module"}:
        return support.launch.run_deepspeed(
            args, num_gpus, script, timeout, check, launcher_args, env
        )
    port = free_port()
    module = bool(launcher_args)
    cmd, env = node_launch(num_gpus, port, script, args, env or launch_env(), module, lean=True)
    return run_launch(cmd, env, port, timeout, check)


def node_launch(
    num_gpus: int,
    port: int,
    script: Path | str,
    args: list[str],
    env: dict[str, str],
    module: bool = False,
    lean: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """The command `deepspeed --num_gpus N [--module] script args` runs on one node, and its
    environment (deepspeed/launcher/runner.py, its single-node branch): `python -m
    deepspeed.launcher.launch` with the node's world, `env` with the working directory (the
    repo) first on PYTHONPATH so the ranks import this checkout's gpt_ds. Starting it directly
    saves the runner's own Python start-up, about 2.5 s of each launch here; the runner is
    tested where it does something (tests/test_launchers.py, test_faults.py's signals, the
    hostfile and multi-node tests). `lean` starts node_launcher.py in its place: the same
    ranks, without the per-node launcher's own ~4.5 s."""
    world = json.dumps({"localhost": list(range(num_gpus))}).encode()
    launcher = [str(NODE_LAUNCHER)] if lean else ["-m", "deepspeed.launcher.launch"]
    cmd = [
        sys.executable,
        "-u",
        *launcher,
        f"--world_info={base64.urlsafe_b64encode(world).decode()}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        *(["--module"] if module else []),
        *([] if lean else ["--enable_each_rank_log=None", "--log_level=info"]),
        str(script),
        *args,
    ]
    return cmd, checkout_first(env)


def checkout_first(env: dict[str, str]) -> dict[str, str]:
    """`env` with this checkout first on PYTHONPATH: a launched process imports its gpt_ds.
    Once only: a process launched from a launched process (a `run_python` script's) has the
    same PYTHONPATH, which the suite's zygote compares."""
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    return {**env, "PYTHONPATH": os.pathsep.join([str(REPO), *rest])}


def run_python(
    args: list[str],
    timeout: float = 600,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`python args...` in the repo with the test environment; output captured. A script
    (not `-c`/`-m`) is forked by the suite's zygote where one serves (`zygote`), with this
    checkout first on PYTHONPATH as a launch's ranks have it; else support.launch.run_python."""
    env = env or launch_env()
    with_repo = checkout_first(env)
    path = serving(with_repo, sys.executable)
    if path is None or str(args[0]).startswith("-"):
        return support.launch.run_python(args, timeout, check, env)
    proc = run_forked(path, [str(a) for a in args], with_repo, timeout)
    return checked(proc, "command") if check else proc


def run_forked(
    path: str, args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *args], capture_output=True, text=True)` with the process
    forked by the zygote at `path`: its stdin /dev/null, stdout and stderr read to their end."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    with open(os.devnull) as null:
        proc = Forked(path, args, env, str(REPO), fds=(null.fileno(), out_w, err_w))
    os.close(out_w)
    os.close(err_w)
    read = {out_r: bytearray(), err_r: bytearray()}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in read:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                raise subprocess.TimeoutExpired([sys.executable, *args], timeout)
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    read[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
    out, err = (bytes(read[fd]).decode(errors="replace") for fd in (out_r, err_r))
    return subprocess.CompletedProcess([sys.executable, *args], proc.wait(), out, err)


class Launch(support.faults.Launch):
    """support.faults.Launch, started as a test asks: `runner=False`: DeepSpeed's per-node
    launcher only; with `lean`, the suite's in its place (node_launcher.py: the same ranks,
    ~4.5 s less; forked by the suite's zygote where one serves, one rank too), for runs whose
    test is about the trainer, not about how a launcher treats its ranks. One rank:
    `python gpt_ds/train.py`. A lean launch's ranks are found by the pids its launcher writes
    (forked ranks are the zygote's children), and are not in the launch's process group."""

    def __init__(
        self,
        args: list[str],
        log: Path,
        num_gpus: int = 2,
        runner: bool = True,
        lean: bool = False,
    ):
        self.runner, self.lean = runner, lean
        self.pid_file: Path | None = None
        super().__init__(args, log, num_gpus)

    def command(self, args: list[str], num_gpus: int) -> tuple[list[str], dict[str, str]]:
        """The launch the test asked for (see the class) and its environment."""
        env = launch_env()
        if num_gpus == 1:  # plain `python train.py`: a world of one, on the launch's port
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port))
            with_repo = checkout_first(env)
            if self.lean and serving(with_repo, sys.executable):  # forked by the suite's zygote
                return [sys.executable, "-u", str(ZYGOTE), "run", str(TRAIN), *args], with_repo
            return [sys.executable, str(TRAIN), *args], env
        if self.runner:
            return super().command(args, num_gpus)
        cmd, env = node_launch(num_gpus, self.port, TRAIN, args, env, lean=self.lean)
        if self.lean:
            self.pid_file = self.log.with_name(self.log.name + ".pids")
            env[RANK_PIDS_ENV] = str(self.pid_file)
        return cmd, env

    def outside_pids(self) -> list[int]:
        """The ranks node_launcher.py started, in rank order (none before it wrote them, or
        for a launch that is not lean)."""
        return [] if self.pid_file is None else read_pids(str(self.pid_file))

    def rank(self, r: int) -> psutil.Process:
        """Rank r's Python process: by the pids a lean launch's launcher wrote, else by the
        `--local_rank=r` its launcher gives it."""
        if self.pid_file is None:
            return super().rank(r)
        pids = self.outside_pids()
        if r >= len(pids):
            raise LookupError(f"no rank {r} among {pids} (of {self.pid_file})")
        self.processes()  # remembered, to wait for it at the end
        return self.seen.get(pids[r]) or psutil.Process(pids[r])


def run_checked(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    """Run `cmd` (paths allowed) in `cwd`; its stdout, or a failure showing both streams."""
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"rc={proc.returncode}: {' '.join(map(str, cmd))}\n"
        f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def train_fails(args: list[str]) -> str:
    """Run the trainer on one process; assert it stops in validation; return what it said."""
    proc = run_python([str(TRAIN), *args], timeout=300, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"rc={proc.returncode}\n{said[-4000:]}"
    assert "Traceback" not in said, said[-4000:]
    assert "rank 0/1" not in said, "got as far as the process group: " + said[-4000:]
    return proc.stderr


def run_benchmark(
    name: str, *flags: str, work_dir: Path, data_dir: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """benchmarks/`name`.py with `flags`, its scratch in `work_dir`, on `data_dir`'s tokens
    if given (else it prepares its own): the benchmarks' smoke tests. The script is forked
    by the zygote (`run_python`); the runs it launches are the `deepspeed` command's, as a
    user's."""
    args = [str(REPO / "benchmarks" / f"{name}.py"), *flags, "--work_dir", str(work_dir)]
    if data_dir is not None:
        args += ["--data_dir", str(data_dir)]
    return run_python(args, timeout=timeout)
