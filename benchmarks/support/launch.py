"""Launch real DeepSpeed runs from tests and benchmarks: free ports, an isolated JIT cache, no
leaked /dev/shm.

Every test that starts ranks goes through `run_deepspeed` (or `run_python` for one process) so
that each launch uses its own port and its shared-memory buffers are removed afterwards, even
when a rank was killed. `tiny_run_args` gives the arguments of a small, fast CPU run;
`planned` the trainer's plan for a launch's flags, planned in this process.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from support.zygote import ZYGOTE_ENV, Forked, serving

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "gpt_ds" / "train.py"
NODE_LAUNCHER = Path(__file__).with_name("node_launcher.py")
ZYGOTE = Path(__file__).with_name("zygote.py")
VENV_BIN = Path(sys.executable).parent


def deepspeed_command() -> list[str]:
    """The `deepspeed` command for this interpreter: the console script beside it (a venv's
    bin/), else DeepSpeed's runner module, which that script runs (an image's site-packages or
    a `pip install --target` kit make no script there; another environment's on PATH would
    start its own Python)."""
    script = VENV_BIN / "deepspeed"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-u", "-m", "deepspeed.launcher.runner"]


# --max_iters of conftest's `stage_run`: one run per ZeRO stage per session
STAGE_RUN_ITERS = 24


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (bound once on `host` to ask the kernel)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch_env() -> dict[str, str]:
    """The environment every launched rank gets: venv first on PATH, a per-venv JIT cache."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("MASTER_PORT", None)
    env.pop("MASTER_ADDR", None)
    return env


def planned(argv: list[str], ranks: int):
    """gpt_ds's own plan (gpt_ds.run.plan.plan_run) for these `gpt_ds/train.py` flags, in the
    world `deepspeed --num_gpus RANKS` gives it: what a benchmark predicts or hands its peers.
    The plan's out dir is a scratch directory (plan_run creates it): the launches' stay new."""
    import dataclasses
    import tempfile

    from gpt_ds.run.config import parse_args
    from gpt_ds.run.machine import probe_machine
    from gpt_ds.run.plan import plan_run

    with tempfile.TemporaryDirectory() as scratch, _launcher_env(ranks):
        return plan_run(dataclasses.replace(parse_args(argv), out_dir=scratch), probe_machine())


@contextlib.contextmanager
def _launcher_env(ranks: int) -> Iterator[None]:
    """WORLD_SIZE / LOCAL_WORLD_SIZE as `deepspeed --num_gpus RANKS` sets them, for a run planned
    in this process (gpt_ds.run.plan.plan_run reads them before any process group exists)."""
    saved = {k: os.environ.get(k) for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    os.environ.update(WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def zygote(folder: Path) -> Iterator[None]:
    """A support/zygote.py for this process's launches, while the context lasts: their lean
    node launchers (`node_launch(..., lean=True)`), `run_python` and one-rank lean
    `faults.Launch` runs have it fork their processes from one that imported a rank's modules
    once, instead of each process importing them (~6 s a launch).
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


def shm_buffers(master_addr: str, port: int) -> list[Path]:
    """DeepSpeed's CPU all-reduce buffers of one launch (one per rank, never unlinked by it)."""
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{master_addr}_{port}_"
    shm = Path("/dev/shm")
    return sorted(shm.glob(prefix + "*")) if shm.is_dir() else []


def remove_shm_buffers(master_addr: str, port: int) -> None:
    """Unlink the buffers `shm_buffers` finds (the ranks are gone, or will not need them)."""
    for p in shm_buffers(master_addr, port):
        p.unlink(missing_ok=True)


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
    Runs what that command runs on one node, through support/node_launcher.py (DeepSpeed's
    per-node launcher without its start-up), unless `extra_launcher_args` asks for the runner
    (a hostfile, --include, ...): see `node_launch`. `fresh`: ranks that import for themselves,
    not forked by the suite's zygote (a test of what a user's fresh process holds)."""
    port = free_port()
    if fresh:
        env = {k: v for k, v in (env or launch_env()).items() if k != ZYGOTE_ENV}
    launcher_args = extra_launcher_args or []
    if set(launcher_args) <= {"--module"}:
        module = bool(launcher_args)
        cmd, env = node_launch(num_gpus, port, script, args, env or launch_env(), module, lean=True)
    else:
        cmd = [
            *deepspeed_command(),
            "--num_gpus",
            str(num_gpus),
            "--master_port",
            str(port),
            *launcher_args,
            str(script),
            *args,
        ]
        env = env or launch_env()
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        remove_shm_buffers("127.0.0.1", port)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"deepspeed run failed (rc={proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


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
    hostfile and multi-node tests). `lean` starts support/node_launcher.py in its place: the
    same ranks, without the per-node launcher's own ~4.5 s."""
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
    Once only: a process launched from a launched process (a benchmark's ranks) has the same
    PYTHONPATH, which the suite's zygote compares."""
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
    checkout first on PYTHONPATH as a launch's ranks have it."""
    env = env or launch_env()
    with_repo = checkout_first(env)
    path = serving(with_repo, sys.executable)
    if path is not None and not str(args[0]).startswith("-"):
        proc = run_forked(path, [str(a) for a in args], with_repo, timeout)
    else:
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed (rc={proc.returncode}): python {' '.join(map(str, args))}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


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
    if given (else it prepares its own): the benchmarks' smoke tests."""
    args = [str(REPO / "benchmarks" / f"{name}.py"), *flags, "--work_dir", str(work_dir)]
    if data_dir is not None:
        args += ["--data_dir", str(data_dir)]
    return run_python(args, timeout=timeout)


def tiny_run_args(data_dir: Path, out_dir: Path, **overrides) -> list[str]:
    """Command-line arguments for a small, fast, deterministic CPU run (fp32)."""
    args = {
        "deepspeed_config": "ds_configs/zero2.json",
        "model": "gpt2-tiny",
        "block_size": 64,
        "micro_batch_size": 4,
        "grad_accum": 1,
        "max_iters": 20,
        "eval_interval": 10,
        "eval_iters": 4,
        "log_interval": 1,
        "lr": 2e-3,
        "warmup_iters": 4,
        "seed": 1337,
        "precision": "fp32",
        "data_dir": str(data_dir),
        "out_dir": str(out_dir),
    }
    args.update(overrides)
    argv = []
    for k, v in args.items():
        if v is True:
            argv.append(f"--{k}")
        elif v is not None and v is not False:
            argv += [f"--{k}", str(v)]
    return argv
