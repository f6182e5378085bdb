"""A launch refused before the process group exists always says why, however the launcher
tears its ranks down: DeepSpeed's launcher SIGKILLs the remaining ranks once one exits
non-zero, so a rank 0 that starts later than rank 1 (a slower GPU, node or disk) was killed
before it printed, and the user saw only `sigkill_handler ... return code = 2`."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.launch import (
    REPO,
    TRAIN,
    VENV_BIN,
    free_port,
    launch_env,
    remove_shm_buffers,
    tiny_run_args,
)

# What the memory guard says of a micro-batch no CPU holds (refused in planning, every rank).
REFUSAL = "error: invalid configuration (memory estimate)"
HOLD_S = 2.0


def rank0_pid(launcher: subprocess.Popen, timeout: float = 60) -> int:
    """The pid of the rank DeepSpeed starts with --local_rank=0, as soon as it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--local_rank=0" in argv and str(TRAIN).encode() in argv:
                return int(proc.name)
        if launcher.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError("rank 0 never started")


def launch_with_rank0_held_back(args: list[str]) -> subprocess.CompletedProcess:
    """2 CPU ranks; rank 0 stopped (SIGSTOP) for HOLD_S as soon as it starts, as a slower start
    would hold it, while rank 1 plans, refuses and exits."""
    port = free_port()
    cmd = [str(VENV_BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(port)]
    launcher = subprocess.Popen(
        [*cmd, str(TRAIN), *args],
        cwd=REPO,
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = rank0_pid(launcher)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(HOLD_S)
        os.kill(pid, signal.SIGCONT)
        out, err = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
        remove_shm_buffers("127.0.0.1", port)
    return subprocess.CompletedProcess(launcher.args, launcher.returncode, out, err)


@pytest.mark.slow
def test_a_refusal_reaches_the_user_when_rank_0_starts_late(shakespeare_dir, tmp_path):
    """One launch: SIGSTOP holds rank 0 back for HOLD_S whatever the machine's speed, so the
    order (rank 1 refuses and exits first) is the same at every run, not a race to repeat."""
    args = tiny_run_args(shakespeare_dir, tmp_path / "run", micro_batch_size=4096)
    proc = launch_with_rank0_held_back(args)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said[-3000:]
    assert said.count(REFUSAL) == 1, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
