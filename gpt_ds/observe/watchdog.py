"""A hang that names its rank (`--hang_timeout`).

Every rank runs a thread that keeps a heartbeat file, OUT_DIR/.heartbeat/rank<N>.json: when the
thread last ran (`alive`), when the rank last made progress (`progress`: a micro-step, an
evaluation, a checkpoint write) and what it was doing (`phase`). The files need no rank's help
to be read: the c10d store lives in rank 0, and a stopped rank 0 would take it along. When a
rank has made no progress for the timeout, its thread writes its Python stacks and phase to
OUT_DIR/hang/rank<N>.txt (faulthandler works while the main thread waits in a collective),
reads every heartbeat, and the first rank to get there prints one line naming the silent ranks
(their thread stopped too: a stopped or dead process) and what the others wait in. Then it
exits non-zero with `os._exit`, and the launcher ends the rest. It writes no checkpoint: those
on disk stay as they are.

The timeout is `--hang_timeout` seconds, or by default max(5 minutes, 20 x the median step);
the judging starts after the first step (start-up and compilation can take long) and a
checkpoint write gets 4 x the timeout. 0 turns it off.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base import logs

HEARTBEAT_S = 1.0
BEAT_MIN_GAP_S = 0.05  # the main thread's writes, at most this often
AUTO_FLOOR_S = 300.0
AUTO_STEPS = 20  # x the median step
SAVE_GRACE = 4  # a checkpoint write's allowance, x the timeout
HANG_EXIT_CODE = 3


class Watchdog:
    """This rank's heartbeat and hang judge; `progress(phase)` at every unit of work."""

    def __init__(self, out_dir: str | Path, rank: int, world_size: int, timeout_s: float | None):
        self.out_dir, self.rank, self.world_size = Path(out_dir), rank, world_size
        self.fixed_timeout = timeout_s  # None: from the measured steps
        self.beat_dir, self.hang_dir = self.out_dir / ".heartbeat", self.out_dir / "hang"
        self.phase, self.iteration = "start-up", 0
        self.last_progress = time.time()
        self.steps: deque[float] = deque(maxlen=50)
        self._written = 0.0  # when the heartbeat file was last written
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpt_ds-watchdog", daemon=True)

    @classmethod
    def start(cls, out_dir, rank: int, world_size: int, flag: float | None) -> Watchdog | None:
        """A running watchdog for `--hang_timeout FLAG` (None: auto), or None for 0."""
        if flag is not None and flag <= 0:
            return None
        dog = cls(out_dir, rank, world_size, flag)
        dog.beat_dir.mkdir(parents=True, exist_ok=True)
        if torch.cuda.is_available():  # NCCL's flight-recorder dump goes there
            dog.hang_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # a report of an earlier launch
            (dog.hang_dir / f"rank{rank}.txt").unlink()
        dog._beat()
        dog._thread.start()
        return dog

    # ----------------------------------------------------------------- the main thread
    def progress(self, phase: str, iteration: int | None = None) -> None:
        """Record a unit of work and what the rank does next; the heartbeat file follows at
        once (at most every BEAT_MIN_GAP_S), so a rank stopped right after says where."""
        self.phase, self.last_progress = phase, time.time()
        if iteration is not None:
            self.iteration = iteration
        if self.last_progress - self._written >= BEAT_MIN_GAP_S:
            self._beat()

    def step_done(self, seconds: float) -> None:
        """An optimizer step's duration: the auto timeout's measure; arms the judging."""
        self.steps.append(seconds)

    def close(self) -> None:
        """Stop the thread and remove the heartbeat (a finished rank is not a silent one)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self._beat_file(self.rank).unlink()
        with contextlib.suppress(OSError):  # the last rank out removes the folder
            self.beat_dir.rmdir()

    # ----------------------------------------------------------------- the thread
    def timeout(self) -> float | None:
        """Seconds without progress that count as a hang now; None before the first step."""
        if not self.steps:
            return None
        base = self.fixed_timeout or max(AUTO_FLOOR_S, AUTO_STEPS * statistics.median(self.steps))
        return base * (SAVE_GRACE if self.phase.startswith("save") else 1)

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._beat()
            limit = self.timeout()
            if limit is not None and time.time() - self.last_progress > limit:
                self._hang(limit)

    def _beat_file(self, rank: int) -> Path:
        return self.beat_dir / f"rank{rank}.json"

    def _beat(self) -> None:
        beat: dict[str, Any] = {
            "rank": self.rank,
            "pid": os.getpid(),
            "alive": time.time(),
            "progress": self.last_progress,
            "phase": self.phase,
            "iter": self.iteration,
        }
        self._written = beat["alive"]
        tmp = self.beat_dir / f".rank{self.rank}.{threading.get_ident()}.tmp"  # one per thread
        with contextlib.suppress(OSError):  # a full disk must not stop training
            tmp.write_text(json.dumps(beat))
            os.replace(tmp, self._beat_file(self.rank))

    def _hang(self, limit: float) -> None:
        """Write this rank's stacks, report (first rank only), exit non-zero."""
        self.hang_dir.mkdir(parents=True, exist_ok=True)
        stacks = self.hang_dir / f"rank{self.rank}.txt"
        with stacks.open("w") as f:
            f.write(f"rank {self.rank}, pid {os.getpid()}: no progress for {limit:.0f} s\n")
            f.write(f"iteration {self.iteration}, last in: {self.phase}\n\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        beats = read_heartbeats(self.beat_dir, self.world_size)
        line = hang_line(beats, self.world_size, self.iteration, time.time(), limit)
        line += f" (stacks: {self.hang_dir}/rank<N>.txt)"
        if _claim(self.hang_dir / "report.txt", line):
            logs.whole_line(f"error: {line}")
        os._exit(HANG_EXIT_CODE)


# torch's flight-recorder variables and the older names it still reads (and warns about)
FLIGHT_RECORDER_OLD_NAMES = {
    "TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
}


def flight_recorder_env(out_dir: str | Path, environ: Iterable[str]) -> dict[str, str]:
    """NCCL's flight recorder on by default (a user's own settings kept, under either name),
    its dump in OUT_DIR/hang/ beside the stacks: torch records each rank's last collectives and
    writes them when its NCCL watchdog times out. Ignored by gloo."""
    wanted = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(Path(out_dir) / "hang" / "nccl_trace_rank_"),
    }
    given = set(environ)
    return {
        k: v
        for k, v in wanted.items()
        if k not in given and FLIGHT_RECORDER_OLD_NAMES.get(k) not in given
    }


def _claim(path: Path, text: str) -> bool:
    """Create `path` with `text` unless another rank did first."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return True


def read_heartbeats(beat_dir: Path, world_size: int) -> dict[int, dict]:
    """rank -> its last heartbeat, for the ranks whose file can be read."""
    beats = {}
    for rank in range(world_size):
        with contextlib.suppress(OSError, ValueError):
            beats[rank] = json.loads((beat_dir / f"rank{rank}.json").read_text())
    return beats


def hang_line(beats: dict[int, dict], world_size: int, iteration: int, now: float, limit: float):
    """One line: the silent ranks (their heartbeat stopped) with their last phase, what the
    others wait in, the ranks without a readable heartbeat."""
    silent_after = min(10.0, limit / 2)  # heartbeats come every second
    silent = sorted(r for r, b in beats.items() if now - b["alive"] > silent_after)
    waiting = sorted(r for r in beats if r not in silent)
    unknown = [r for r in range(world_size) if r not in beats]
    parts = [
        f"rank {r} silent since {time.strftime('%H:%M:%S', time.localtime(beats[r]['alive']))}, "
        f"last in {beats[r]['phase']}"
        for r in silent
    ]
    if waiting:
        phases = sorted({beats[r]["phase"] for r in waiting})
        who = _ranks_word(waiting)
        parts.append(f"{who} wait in {'; '.join(phases)}")
    if unknown:
        parts.append(f"{_ranks_word(unknown)}: no heartbeat file (out dir not shared?)")
    if not silent:
        parts.insert(0, f"no rank made progress for {limit:.0f} s")
    return f"hang at iter {iteration}: " + "; ".join(parts)


def _ranks_word(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
