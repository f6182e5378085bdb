"""A training run in the background that a test (or the fault drill) can kill, signal and watch.

`Launch` starts `deepspeed --num_gpus N gpt_ds/train.py ...` in its own session with output to a
log file, finds its ranks and launcher by command line, waits for conditions on the run's files,
and at the end kills whatever is left and removes the launch's /dev/shm buffers (only then: a
test may first assert what a kill left). The test suite's launches of the same run (DeepSpeed's
per-node launcher alone, or the suite's lean one) are tests/harness/launch.py's `Launch`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from support.launch import REPO, TRAIN, deepspeed_launch, free_port, launch_env, shm_buffers


class Launch:
    """One training run in the background, in its own session, output to a log file."""

    def __init__(self, args: list[str], log: Path, num_gpus: int = 2):
        self.port = free_port()
        self.log = log
        cmd, env = self.command(args, num_gpus)
        with log.open("w") as f:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.seen: dict[int, psutil.Process] = {}

    def command(self, args: list[str], num_gpus: int) -> tuple[list[str], dict[str, str]]:
        """`deepspeed --num_gpus N --master_port PORT gpt_ds/train.py args` and its environment."""
        return deepspeed_launch(num_gpus, self.port, TRAIN, args, []), launch_env()

    def outside_pids(self) -> list[int]:
        """Ranks of the launch that are not its launcher's descendants: none here."""
        return []

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def processes(self) -> list[psutil.Process]:
        """The launcher's live descendants and `outside_pids` (also remembered, to wait for
        orphans later)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            kids = []
        known = {k.pid for k in kids}
        for pid in self.outside_pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                if pid not in known:
                    kids.append(psutil.Process(pid))
        for k in kids:
            self.seen.setdefault(k.pid, k)
        return kids

    def _find(self, needle: str) -> psutil.Process:
        for p in self.processes():
            try:
                if needle in p.cmdline():
                    return p
            except psutil.Error:
                continue
        raise LookupError(f"no process with {needle!r} under {self.proc.pid}")

    def rank(self, r: int) -> psutil.Process:
        """Rank r's Python process (the launcher gives it `--local_rank=r`)."""
        return self._find(f"--local_rank={r}")

    def launcher(self) -> psutil.Process:
        """DeepSpeed's per-node launcher, `python -m deepspeed.launcher.launch`: the runner's
        child, or the launch itself."""
        if "deepspeed.launcher.launch" in self.proc.args:
            return psutil.Process(self.proc.pid)
        return self._find("deepspeed.launcher.launch")

    def wait_for(self, condition, what: str, timeout: float = 180, poll: float = 0.005) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                raise AssertionError(f"the run ended (rc={rc}) before {what}:\n" + self.tail())
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n" + self.tail())
            time.sleep(poll)

    def finish(self, timeout: float = 300) -> int:
        """Exit status of the command; also waits for every rank it started (they can outlive
        `deepspeed` after a Ctrl-C)."""
        self.processes()
        rc = self.proc.wait(timeout)
        _, alive = psutil.wait_procs(list(self.seen.values()), timeout=60)
        assert not alive, f"processes outlived the run: {alive}"
        return rc

    def finish_ok(self, timeout: float = 300) -> Launch:
        rc = self.finish(timeout)
        assert rc == 0, f"run failed (rc={rc}):\n{self.tail()}"
        assert self.shm() == [], "a rank left its /dev/shm buffer after a normal end"
        return self

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]

    def shm(self) -> list[Path]:
        """This launch's DeepSpeed buffers still in /dev/shm (gpt_ds's ranks make none; a
        rank that built DeepSpeed's CPU comm op would leave one)."""
        return shm_buffers("127.0.0.1", self.port)

    def cleanup(self) -> None:
        self.processes()  # `outside_pids` are outside its process group
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        for p in self.seen.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
        for p in self.shm():
            p.unlink(missing_ok=True)
