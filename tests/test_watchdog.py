"""gpt_ds.observe.watchdog: the hang line from heartbeats, the timeout's rules, NCCL's flight
recorder settings, and one real process whose main thread stops making progress (the real
SIGSTOPped ranks are tests/test_faults.py's)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from support.launch import REPO

from gpt_ds.observe.watchdog import (
    AUTO_FLOOR_S,
    HANG_EXIT_CODE,
    Watchdog,
    flight_recorder_env,
    hang_line,
)

NOW = 1_800_000_000.0


def beat(phase: str, alive_ago: float) -> dict:
    return {"alive": NOW - alive_ago, "progress": NOW - 60, "phase": phase, "iter": 40}


def test_the_line_names_the_silent_rank_and_what_the_others_wait_in():
    beats = {
        0: beat("all_reduce of iter 40's loss and stop flag", 1),
        1: beat("save iter_40", 30),
        2: beat("all_reduce of iter 40's loss and stop flag", 0.5),
    }
    line = hang_line(beats, world_size=4, iteration=40, now=NOW, limit=20)
    silent_at = time.strftime("%H:%M:%S", time.localtime(NOW - 30))
    assert line == (
        f"hang at iter 40: rank 1 silent since {silent_at}, last in save iter_40; ranks 0,2 "
        "wait in all_reduce of iter 40's loss and stop flag; rank 3: no heartbeat file (out "
        "dir not shared?)"
    )


def test_no_silent_rank_is_a_deadlock_of_live_ranks():
    beats = {r: beat(f"engine step of iter 7, micro-step {r + 1}/2", 1) for r in (0, 1)}
    line = hang_line(beats, world_size=2, iteration=7, now=NOW, limit=300)
    assert line.startswith("hang at iter 7: no rank made progress for 300 s; ranks 0,1 wait in ")


def test_the_timeout_starts_after_a_step_and_follows_the_steps(tmp_path):
    dog = Watchdog(tmp_path, rank=0, world_size=1, timeout_s=None)
    assert dog.timeout() is None  # start-up and the first step are not judged
    for seconds in (0.5, 0.6, 40.0):
        dog.step_done(seconds)
    assert dog.timeout() == AUTO_FLOOR_S  # 20 x the 0.6 s median is below the floor
    for _ in range(3):
        dog.step_done(30.0)
    assert dog.timeout() == 20 * 30.0
    dog.progress("save iter_8")
    assert dog.timeout() == 4 * 20 * 30.0  # a checkpoint write's allowance
    fixed = Watchdog(tmp_path, rank=0, world_size=1, timeout_s=7)
    fixed.step_done(100.0)
    assert fixed.timeout() == 7
    assert Watchdog.start(tmp_path, 0, 1, flag=0) is None  # off


def test_nccls_flight_recorder_is_on_unless_the_user_set_it(tmp_path):
    """torch's own names (TORCH_FR_*: it warns about the older TORCH_NCCL_* ones on every rank,
    even on gloo); a user's setting under either name is kept."""
    dump = f"{tmp_path}/hang/nccl_trace_rank_"
    assert flight_recorder_env(tmp_path, {}) == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": dump,
    }
    for users in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        env = flight_recorder_env(tmp_path, {users: "100"})
        assert env == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": dump}


STALLED = """
import sys, time
from gpt_ds.observe.watchdog import Watchdog
dog = Watchdog.start(sys.argv[1], rank=0, world_size=1, flag=2)
dog.step_done(0.1)
dog.progress("evaluation at iter 3", 3)
time.sleep(60)  # the main thread stops making progress
"""


def test_a_process_that_stops_making_progress_writes_its_stacks_and_exits(tmp_path):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", STALLED, str(tmp_path)], cwd=REPO, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr
    assert time.monotonic() - start < 30
    assert proc.stdout.startswith("error: hang at iter 3: no rank made progress for 2 s; rank 0 ")
    assert "wait in evaluation at iter 3" in proc.stdout
    stacks = (tmp_path / "hang" / "rank0.txt").read_text()
    assert "iteration 3, last in: evaluation at iter 3" in stacks
    assert "most recent call first" in stacks and '"<string>", line 7' in stacks, stacks
    assert (tmp_path / "hang" / "report.txt").read_text().startswith("hang at iter 3")
    beat_file = json.loads((tmp_path / ".heartbeat" / "rank0.json").read_text())
    assert beat_file["phase"] == "evaluation at iter 3" and beat_file["iter"] == 3


@pytest.mark.parametrize("flag", [None, 5.0])
def test_a_finished_rank_leaves_no_heartbeat(tmp_path, flag):
    dog = Watchdog.start(tmp_path, rank=0, world_size=1, flag=flag)
    assert (tmp_path / ".heartbeat" / "rank0.json").exists()
    dog.close()
    assert not (tmp_path / ".heartbeat").exists()
