"""--profile: torch.profiler over a few training steps after warm-up writes each rank's
Chrome/Perfetto trace and prints the top operators, without changing what the run trains."""

from __future__ import annotations

import json

import pytest
import torch
from harness.launch import STAGE_RUN_ITERS, run_deepspeed
from helpers.logged import train_losses
from support.launch import tiny_run_args

from gpt_ds.observe.profile import (
    PROFILE_STEPS,
    SYNC_DEBUG_ENV,
    WARMUP_STEPS,
    StepProfiler,
    profile_window,
)


def test_the_window_follows_the_warm_up_and_stays_inside_the_run():
    assert profile_window(1, 100) == (1 + WARMUP_STEPS, WARMUP_STEPS + PROFILE_STEPS)
    assert profile_window(41, 100) == (41 + WARMUP_STEPS, 40 + WARMUP_STEPS + PROFILE_STEPS)
    assert profile_window(1, 4) == (3, 4)  # clipped to the run's last step
    assert profile_window(5, 5) == (5, 5)  # a one-step launch profiles that step


def trace_names(path) -> set[str]:
    return {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}


def test_the_window_records_only_its_steps(tmp_path, capsys):
    profiler = StepProfiler(tmp_path, first=1, last=10, enabled=True)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    for it in range(1, 11):
        with profiler.step(it):
            torch.mm(a, b) if it in range(3, 6) else torch.add(a, b)
    profiler.close()  # the run's end: nothing left open to write
    (trace,) = (tmp_path / "profile").iterdir()
    assert trace.name == "rank0.steps3-5.json"
    names = trace_names(trace)
    assert "aten::mm" in names and "aten::add" not in names
    out = capsys.readouterr().out
    assert "profile of steps 3-5" in out and "Self CPU" in out and "aten::mm" in out


def test_a_run_ending_inside_the_window_still_writes_what_it_profiled(tmp_path):
    profiler = StepProfiler(tmp_path, first=1, last=10, enabled=True)
    for it in range(1, 5):  # stopped (a signal, a plateau) after step 4 of the window 3-5
        with profiler.step(it):
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    profiler.close()
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["rank0.steps3-4.json"]


def test_a_sync_debug_mode_torch_does_not_know_is_refused_naming_the_variable(
    tmp_path, monkeypatch
):
    """GPT_DS_SYNC_DEBUG (torch's sync check over the window, on GPUs) takes torch's modes."""
    monkeypatch.setenv(SYNC_DEBUG_ENV, "raise")
    with pytest.raises(ValueError, match=f"{SYNC_DEBUG_ENV}='raise': use warn or error"):
        StepProfiler(tmp_path, 1, 10, enabled=True)
    monkeypatch.setenv(SYNC_DEBUG_ENV, "error")
    assert StepProfiler(tmp_path, 1, 10, enabled=True).sync_mode == "error"


def test_without_the_flag_nothing_is_profiled(tmp_path):
    profiler = StepProfiler(tmp_path, first=1, last=10, enabled=False)
    for it in range(1, 11):
        with profiler.step(it):
            torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    profiler.close()
    assert not (tmp_path / "profile").exists()


@pytest.mark.slow
def test_a_profiled_run_trains_as_the_unprofiled_one(shakespeare_dir, stage_run, tmp_path):
    """The first 6 steps of conftest's ZeRO-2 run (its schedule kept with --lr_decay_iters),
    profiled at steps 3-5 on 2 ranks: the same losses, a trace per rank, the table."""
    ref, _ = stage_run(2)
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir, out, max_iters=6, lr_decay_iters=STAGE_RUN_ITERS, profile=True
    )
    stdout = run_deepspeed(args).stdout
    assert sorted(p.name for p in (out / "profile").iterdir()) == [
        "rank0.steps3-5.json",
        "rank1.steps3-5.json",
    ]
    for trace in (out / "profile").iterdir():
        assert {"aten::mm", "aten::addmm"} & trace_names(trace), trace
    assert stdout.count("profile of steps 3-5") == 1 and "Self CPU" in stdout
    ours, theirs = train_losses(out), train_losses(ref)
    assert sorted(ours) == list(range(1, 7))
    assert all(ours[it] == theirs[it] for it in ours), (ours, theirs)
