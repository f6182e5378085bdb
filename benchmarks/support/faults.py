"""A training run in the background that a test (or the fault drill) can kill, signal and watch.

`Launch` starts `deepspeed --num_gpus N gpt_ds/train.py ...` (or, with `runner=False`, what that
command runs on one node: DeepSpeed's per-node launcher; `python gpt_ds/train.py` for one rank)
in its own session with output to a log file, finds its ranks and launcher by command
line, waits for conditions on the run's files, and at the end kills whatever is left and
removes the launch's /dev/shm buffers (only then: a test may first assert what a kill left).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from support.launch import (
    REPO,
    TRAIN,
    ZYGOTE,
    checkout_first,
    deepspeed_command,
    free_port,
    launch_env,
    node_launch,
    shm_buffers,
)
from support.zygote import RANK_PIDS_ENV, read_pids, serving


class Launch:
    """One training run in the background, in its own session, output to a log file."""

    def __init__(
        self,
        args: list[str],
        log: Path,
        num_gpus: int = 2,
        runner: bool = True,
        lean: bool = False,
    ):
        """`runner=False`: DeepSpeed's per-node launcher only; with `lean`, the suite's own in
        its place (support/node_launcher.py: the same ranks, ~4.5 s less; forked by the
        suite's zygote where one serves, one rank too), for runs whose test is about the
        trainer, not about how a launcher treats its ranks. A lean launch's ranks are found
        by the pids its launcher writes (forked ranks are the zygote's children), and are
        not in the launch's process group."""
        self.port = free_port()
        self.log = log
        self.pid_file: Path | None = None
        env = launch_env()
        if num_gpus == 1:  # plain `python train.py`: a world of one, port fixed for the shm name
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port))
            cmd = [sys.executable, str(TRAIN), *args]
            with_repo = checkout_first(env)
            if lean and serving(with_repo, sys.executable):  # forked by the suite's zygote
                env, cmd = with_repo, [sys.executable, "-u", str(ZYGOTE), "run", str(TRAIN), *args]
        elif not runner:  # the runner's own start-up spared (support.launch.node_launch)
            cmd, env = node_launch(num_gpus, self.port, TRAIN, args, env, lean=lean)
            if lean:
                self.pid_file = log.with_name(log.name + ".pids")
                env[RANK_PIDS_ENV] = str(self.pid_file)
        else:
            cmd = [*deepspeed_command(), "--num_gpus", str(num_gpus)]
            cmd += ["--master_port", str(self.port), str(TRAIN), *args]
        with log.open("w") as f:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.seen: dict[int, psutil.Process] = {}

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def processes(self) -> list[psutil.Process]:
        """The launcher's live descendants and a lean launch's ranks (also remembered, to wait
        for orphans later)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            kids = []
        known = {k.pid for k in kids}
        for pid in self.lean_rank_pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                if pid not in known:
                    kids.append(psutil.Process(pid))
        for k in kids:
            self.seen.setdefault(k.pid, k)
        return kids

    def lean_rank_pids(self) -> list[int]:
        """The ranks support/node_launcher.py started, in rank order (none before it wrote
        them, or for a launch that is not lean)."""
        return [] if self.pid_file is None else read_pids(str(self.pid_file))

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
        if self.pid_file is not None:
            pids = self.lean_rank_pids()
            if r >= len(pids):
                raise LookupError(f"no rank {r} among {pids} (of {self.pid_file})")
            self.processes()  # remembered, to wait for it at the end
            return self.seen.get(pids[r]) or psutil.Process(pids[r])
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
        """This launch's DeepSpeed buffers still in /dev/shm."""
        return shm_buffers("127.0.0.1", self.port)

    def shm_of(self, ranks) -> list[Path]:
        uid = os.getuid()
        name = f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_{self.port}_{{}}"
        return sorted(Path("/dev/shm") / name.format(r) for r in ranks)

    def cleanup(self) -> None:
        self.processes()  # a lean launch's ranks are outside its process group
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        for p in self.seen.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
        for p in self.shm():
            p.unlink(missing_ok=True)
