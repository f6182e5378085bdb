"""Launch real DeepSpeed runs as a user does: the `deepspeed` command on a free port, an isolated
JIT cache, no leaked /dev/shm.

A benchmark (and a test, where the runner is what it tests) starts ranks through `run_deepspeed`
so that each launch uses its own port and its shared-memory buffers are removed afterwards,
even when a rank was killed. `tiny_run_args` gives the arguments of a small, fast CPU run;
`planned` the trainer's plan for a launch's flags, planned in this process. The test suite's
faster launches of the same runs are tests/harness/launch.py's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "gpt_ds" / "train.py"
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


def deepspeed_launch(
    num_gpus: int, port: int, script: Path | str, args: list[str], launcher_args: list[str]
) -> list[str]:
    """`deepspeed --num_gpus N --master_port PORT [launcher args] script args`, as one list."""
    cmd = [*deepspeed_command(), "--num_gpus", str(num_gpus), "--master_port", str(port)]
    return [*cmd, *launcher_args, str(script), *args]


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

    from gpt_ds.launch.machine import probe_machine
    from gpt_ds.run.config import parse_args
    from gpt_ds.run.plan import plan_run

    with tempfile.TemporaryDirectory() as scratch, _launcher_env(ranks):
        return plan_run(dataclasses.replace(parse_args(argv), out_dir=scratch), probe_machine())


@contextlib.contextmanager
def _launcher_env(ranks: int) -> Iterator[None]:
    """WORLD_SIZE / LOCAL_WORLD_SIZE as `deepspeed --num_gpus RANKS` sets them, for a run planned
    in this process (gpt_ds.launch.machine.probe_machine reads them before any process group)."""
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
) -> subprocess.CompletedProcess:
    """`deepspeed --num_gpus N [extra launcher args] script args...` on localhost with a fresh
    port, in the repo; output captured."""
    port = free_port()
    cmd = deepspeed_launch(num_gpus, port, script, args, extra_launcher_args or [])
    return run_launch(cmd, env or launch_env(), port, timeout, check)


def run_launch(
    cmd: list[str], env: dict[str, str], port: int, timeout: float, check: bool
) -> subprocess.CompletedProcess:
    """Run a launch's `cmd` in the repo, output captured; then unlink its buffers on `port`.
    With `check`, a failure raises with the end of both streams."""
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    finally:
        remove_shm_buffers("127.0.0.1", port)
    return checked(proc, "deepspeed run") if check else proc


def run_python(
    args: list[str],
    timeout: float = 600,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`python args...` in the repo with the launches' environment; output captured."""
    proc = subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=REPO,
        env=env or launch_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return checked(proc, "command") if check else proc


def checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    """`proc`, or an AssertionError naming `what` and its command, with the end of its output."""
    if proc.returncode != 0:
        cmd = " ".join(map(str, proc.args))
        raise AssertionError(
            f"{what} failed (rc={proc.returncode}): {cmd}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


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
