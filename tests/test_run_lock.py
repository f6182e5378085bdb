"""One run per out dir: two real launches into one directory, and the lock's stale rules with
real processes (a finished one's pid, a reused pid, another host's lock with and without a
recent heartbeat)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from helpers.messages import assert_names
from support.launch import tiny_run_args

from gpt_ds.checkpoint.tags import complete_tags
from gpt_ds.observe.metrics_file import read_metrics
from gpt_ds.run.lock import LOCK_NAME, STALE_AFTER_SECONDS, LockOwner, OutDirBusy, acquire


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_lock(out, **fields) -> LockOwner:
    owner = LockOwner(
        run_id="20260101-000000-abcdef",
        host=socket.gethostname(),
        pid=os.getpid(),
        identity=None,
        started_at="2026-01-01 00:00:00 UTC",
        command="train.py",
    )
    owner = LockOwner(**{**owner.__dict__, **fields})
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_NAME).write_text(json.dumps(owner.__dict__))
    return owner


def test_a_live_local_run_holds_the_lock(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    first = acquire(out, "first")
    with pytest.raises(OutDirBusy) as err:
        acquire(out, "second")
    message = str(err.value)
    host = socket.gethostname()
    # the out dir, who holds it (run, pid, host), and the ways on: the stop command, another dir
    assert_names(message, f"--out_dir {out}", "first", str(os.getpid()), host)
    assert_names(message, f"kill -TERM {os.getpid()} on {host}", "another --out_dir")
    first.release()
    assert not (out / LOCK_NAME).exists()
    acquire(out, "third").release()


@pytest.mark.parametrize("case", ["exited", "pid reused", "another host, silent"])
def test_a_stale_lock_is_replaced_and_said(case, tmp_path):
    out = tmp_path / "run"
    if case == "exited":
        pid = dead_pid()
        old, reason = write_lock(out, pid=pid), f"pid {pid} is not running"
    elif case == "pid reused":  # this very pid, but with another process's start identity
        old, reason = write_lock(out, identity="boot:1"), f"pid {os.getpid()} is now another"
    else:
        old, reason = write_lock(out, host="node-7"), "no heartbeat from host node-7 for 1"
        past = time.time() - STALE_AFTER_SECONDS - 60
        os.utime(out / LOCK_NAME, (past, past))
    notes: list[str] = []
    lock = acquire(out, "new", note=notes.append)
    assert notes == [notes[0]] and f"removing the stale lock of {old.describe()}: " in notes[0]
    assert reason in notes[0], notes
    assert LockOwner.read(out / LOCK_NAME).run_id == "new"
    lock.release()


def test_another_hosts_lock_with_a_recent_heartbeat_is_respected(tmp_path):
    out = tmp_path / "run"
    write_lock(out, host="node-7", pid=4242)
    with pytest.raises(OutDirBusy, match="pid 4242 on host node-7"):
        acquire(out, "new")
    assert LockOwner.read(out / LOCK_NAME).run_id == "20260101-000000-abcdef"


def test_release_never_removes_another_runs_lock(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = acquire(out, "mine")
    write_lock(out, run_id="theirs")  # e.g. a user deleted ours and another run took it
    lock.release()
    assert LockOwner.read(out / LOCK_NAME).run_id == "theirs"


@pytest.mark.slow
def test_a_second_launch_into_the_same_out_dir_is_refused(shakespeare_dir, launch, tmp_path):
    """Run A trains; run B (another seed) into the same --out_dir exits 2 at once naming A,
    while A goes on; every tag and every metrics record is A's, and A's lock is gone at its
    end."""
    out = tmp_path / "run"
    args = tiny_run_args(shakespeare_dir, out, max_iters=30, eval_interval=10, eval_iters=2)
    a = launch(args, "a", lean=True)
    # readable, not only there: the file is created, then its owner written
    a.wait_for(lambda: LockOwner.read(out / LOCK_NAME) is not None, "run A's lock")
    holder = LockOwner.read(out / LOCK_NAME)
    assert holder.pid == a.rank(0).pid
    b = launch([*args, "--seed", "7"], "b", lean=True)
    assert b.finish(timeout=120) == 2, b.tail()
    assert a.proc.poll() is None, "run A ended before run B was refused"
    (refusal,) = [line for line in b.output.splitlines() if "error:" in line]
    assert_names(refusal, f"--out_dir {out}", holder.run_id, str(holder.pid))
    assert b.output.count("error:") == 1
    a.finish_ok()
    records = read_metrics(out)
    assert {r["run_id"] for r in records} == {holder.run_id}
    assert [r["iter"] for r in records if "loss" in r] == list(range(1, 31))
    assert complete_tags(out) == ["iter_10", "iter_20", "final"]
    for tag in complete_tags(out):
        assert json.loads((out / tag / "gpt_ds.json").read_text())["run_id"] == holder.run_id
    assert not (out / LOCK_NAME).exists()


@pytest.mark.slow
def test_a_killed_runs_lock_does_not_block_the_next_run(shakespeare_dir, launch, tmp_path):
    out = tmp_path / "run"
    args = tiny_run_args(shakespeare_dir, out, max_iters=1000, eval_interval=0)
    a = launch(args, "a", num_gpus=1)
    a.wait_for(lambda: LockOwner.read(out / LOCK_NAME) is not None, "the lock")
    pid = LockOwner.read(out / LOCK_NAME).pid
    a.proc.kill()
    a.finish()
    for left in out.iterdir():  # what A wrote before it died: a new run is refused beside it
        if left.name != LOCK_NAME:
            shutil.rmtree(left) if left.is_dir() else left.unlink()
    b = launch([*args, "--max_iters", "2", "--warmup_iters", "1"], "b", num_gpus=1, lean=True)
    b.finish_ok()
    assert "out dir: removing the stale lock of run " in b.output
    assert f"pid {pid} is not running" in b.output
    assert not (out / LOCK_NAME).exists()
