"""Launch real DeepSpeed runs from tests: free ports, an isolated JIT cache, no leaked /dev/shm.

Every test that starts ranks goes through `run_deepspeed` (or `python_cmd` for one process) so
that each launch uses its own port and its shared-memory buffers are removed afterwards, even
when a rank was killed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "gpt_ds" / "train.py"
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port nobody listens on right now (bound once on 127.0.0.1 to ask the kernel)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_env() -> dict[str, str]:
    """The environment every launched rank gets: venv first on PATH, a per-venv JIT cache."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("MASTER_PORT", None)
    env.pop("MASTER_ADDR", None)
    return env


def shm_buffers(master_addr: str, port: int) -> list[Path]:
    """DeepSpeed's CPU all-reduce buffers of one launch (one per rank, never unlinked by it)."""
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{master_addr}_{port}_"
    shm = Path("/dev/shm")
    return sorted(shm.glob(prefix + "*")) if shm.is_dir() else []


def remove_shm_buffers(master_addr: str, port: int) -> None:
    for p in shm_buffers(master_addr, port):
        p.unlink(missing_ok=True)


def run_deepspeed(
    args: list[str],
    num_gpus: int = 2,
    script: Path = TRAIN,
    timeout: float = 600,
    check: bool = True,
    extra_launcher_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`deepspeed --num_gpus N script args...` on localhost with a fresh port; output captured."""
    port = free_port()
    cmd = [
        str(VENV_BIN / "deepspeed"),
        "--num_gpus",
        str(num_gpus),
        "--master_port",
        str(port),
        *(extra_launcher_args or []),
        str(script),
        *args,
    ]
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env=env or test_env(),
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


def run_python(args: list[str], timeout: float = 600, check: bool = True, env=None):
    """`python args...` in the repo with the test environment; output captured."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env or test_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed (rc={proc.returncode}): python {' '.join(args)}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc
