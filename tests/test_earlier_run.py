"""A launch never replaces another run's output (gpt_ds/run/lock.py): without `--resume`,
an out dir holding a run is refused before any work, every file of it left byte-identical;
`--resume auto` starts an empty out dir, continues the newest complete checkpoint, trains
nothing (exit 0, nothing written) when that checkpoint is the run's last step, and starts the
run afresh over what a launch killed before its first checkpoint left (its metrics set aside,
readable apart). The requeue itself (auto, a signal, the same command
again, continuing exactly) is test_faults' SIGTERM-to-`deepspeed` test.

Real runs: copies of the session's finished ZeRO-2 run (conftest.stage_run: iter_10, iter_20,
final at 24, `latest`, metrics.jsonl), launched on 2 ranks where the issue's reproduction needs
it, else one process, or planned in this process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from harness.launch import STAGE_RUN_ITERS, run_deepspeed, run_python
from helpers.files import file_hashes
from helpers.messages import assert_names, names
from support.launch import TRAIN, tiny_run_args

from gpt_ds.base.errors import CheckpointError, ConfigError
from gpt_ds.launch.machine import probe_machine
from gpt_ds.observe.metrics_file import read_attempts, read_metrics
from gpt_ds.observe.plot import load_run
from gpt_ds.run.config import parse_args, validate
from gpt_ds.run.lock import LOCK_NAME, LockOwner, OutDirHasRun
from gpt_ds.run.plan import plan_run, verify_resume


def stage_args(data_dir: Path, out: Path, **more) -> list[str]:
    """The session's ZeRO-2 run (2 ranks x micro-batch 4) for `out`; one process keeps its
    global batch of 8 with grad_accum 2."""
    flags = {"deepspeed_config": "ds_configs/zero2.json", "max_iters": STAGE_RUN_ITERS, **more}
    return tiny_run_args(data_dir, out, **flags)


@pytest.fixture
def finished(stage_run, tmp_path) -> Path:
    """A copy of the session's finished run, this test's to change."""
    return Path(shutil.copytree(stage_run(2)[0], tmp_path / "run"))


@pytest.mark.slow
def test_a_relaunch_without_resume_leaves_a_finished_run_byte_identical(finished, shakespeare_dir):
    """The reproduction, on 2 ranks: the finished run's command again with --max_iters 4 and
    no --resume exits 2 naming each tag with its iteration, `latest` and metrics.jsonl, and
    the ways on; not one file of the first run changed."""
    before = file_hashes(finished)
    proc = run_deepspeed(stage_args(shakespeare_dir, finished, max_iters=4), check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-4000:]
    # the out dir, each thing found with its iteration, and the ways on
    found = ["final/ (iteration 24)", "iter_20/ (iteration 20)", "iter_10/ (iteration 10)"]
    found += ["`latest` (naming final)", "metrics.jsonl (up to iteration 24)"]
    assert_names(said, f"--out_dir {finished}", *found, "--resume", "--resume auto")
    assert_names(said, "another --out_dir")
    assert "rank 0/2" not in said  # before any model
    assert file_hashes(finished) == before


@pytest.mark.slow
def test_resume_auto_on_a_finished_run_trains_nothing_and_past_it_is_refused(
    finished, shakespeare_dir
):
    """The same command requeued with --resume auto (one process): the newest checkpoint,
    verified, is the run's last step, so it exits 0 saying so, having written nothing; a
    shorter run than that checkpoint is refused before any work, naming the lengths."""
    before = file_hashes(finished)
    argv = stage_args(shakespeare_dir, finished, resume="auto", grad_accum=2)
    out = run_python([str(TRAIN), *argv]).stdout
    assert "checkpoint: final verified" in out
    assert f"nothing to train: {finished}/final is at iteration 24, the run's last" in out
    assert file_hashes(finished) == before
    with pytest.raises(ConfigError) as past:
        plan_run(parse_args([*argv, "--max_iters", "4"]), probe_machine())
    assert_names(str(past.value), f"{finished}/final", "24", "4")  # the checkpoint, both lengths


@pytest.mark.slow
def test_resume_auto_continues_the_newest_checkpoint(finished, stage_run, shakespeare_dir):
    """A stopped run (newest checkpoint iter_20, `final` gone): auto resumes iter_20, as
    --resume does, and the job's --init_from (weights for a start) may stay in its command."""
    shutil.rmtree(finished / "final")
    (finished / "latest").write_text("iter_20")
    argv = stage_args(shakespeare_dir, finished, resume="auto", grad_accum=2, max_iters=30)
    plan = plan_run(parse_args(argv), probe_machine())
    assert plan.resume is not None and plan.resume.tag == "iter_20"
    assert plan_run(parse_args([*argv, "--resume"]), probe_machine()).resume == plan.resume
    weights = ["--init_from", f"{stage_run(2)[0]}:iter_10"]
    no_model = stage_args(shakespeare_dir, finished, resume="auto", grad_accum=2, model=None)
    assert (
        plan_run(parse_args([*no_model, *weights, "--max_iters", "30"]), probe_machine()).resume
        == plan.resume
    )
    with pytest.raises(ConfigError) as both:
        validate(parse_args([*no_model, *weights, "--resume", "latest"]), world_size=1)
    assert_names(str(both.value), "--init_from", "--resume")


@pytest.mark.slow
def test_a_resume_on_another_world_size_is_resolved_once(finished, shakespeare_dir, monkeypatch):
    """The 2-rank run resumed by one process, its `final` damaged: planning, verifying and
    falling back to iter_20 resolve the DeepSpeed config once; the engine's config loads a
    universal checkpoint, and the config a checkpoint records is the run's own."""
    from gpt_ds.run import plan as planning

    calls = []
    real = planning.resolve_ds_config
    monkeypatch.setattr(
        planning, "resolve_ds_config", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    largest = max((finished / "final").rglob("*.pt"), key=lambda p: p.stat().st_size)
    with largest.open("r+b") as f:  # same size, other bytes: found by the checksums only
        f.seek(100)
        f.write(b"damaged")
    argv = stage_args(shakespeare_dir, finished, resume="latest", grad_accum=2, max_iters=30)
    plan = verify_resume(plan_run(parse_args(argv), probe_machine()))
    assert plan.resume is not None and plan.resume.tag == "iter_20"
    assert len(calls) == 1
    assert plan.resumes_universal  # saved on 2 ranks, resumed on 1
    assert plan.engine_config()["checkpoint"]["load_universal"] is True
    assert "load_universal" not in plan.record()["deepspeed_config"].get("checkpoint", {})
    assert plan.engine_config()["zero_optimization"] == plan.ds.config["zero_optimization"]


def test_resume_auto_starts_an_out_dir_without_output(shakespeare_dir, tmp_path):
    """Nothing of gpt_ds's there (a missing folder, or one holding other files and a stale
    lock): the run starts, said in one line."""
    for out in (tmp_path / "new", tmp_path / "other"):
        if out.name == "other":
            out.mkdir()
            (out / "notes.txt").write_text("mine")
            (out / LOCK_NAME).write_text(json.dumps({**gone_owner(), "run_id": "old"}))
        plan = plan_run(
            parse_args(tiny_run_args(shakespeare_dir, out, resume="auto")), probe_machine()
        )
        assert plan.resume is None
        said = f"--resume auto: no checkpoint in {out}: starting the run"
        assert any(said in line for line in plan.notes), plan.notes


@pytest.mark.parametrize(
    "leftover, named",
    [
        ("metrics.jsonl", "metrics.jsonl (up to iteration 3)"),
        ("iter_4.partial", "iter_4.partial/ (an interrupted save, no manifest)"),
        ("latest", "`latest` (naming iter_4)"),
    ],
)
def test_output_without_a_checkpoint_is_refused_without_resume_and_started_over_by_auto(
    leftover, named, shakespeare_dir, tmp_path
):
    """A killed launch's metrics, an interrupted save or a lone `latest`: a new run without
    --resume would mix into it and is refused, and so is plain --resume (nothing to continue);
    --resume auto starts the run afresh, saying so in one line that names what is there. The
    plan moves nothing: the trainer sets the metrics aside once the out dir is locked."""
    out = tmp_path / "run"
    out.mkdir()
    if leftover == "metrics.jsonl":
        (out / leftover).write_text('{"kind": "train", "iter": 3, "loss": 9.0}\n{"iter": ')
    elif leftover == "latest":
        (out / leftover).write_text("iter_4")
    else:
        (out / leftover).mkdir()
    cfg = parse_args(tiny_run_args(shakespeare_dir, out))
    with pytest.raises(OutDirHasRun) as refused:
        plan_run(cfg, probe_machine())
    message = str(refused.value)
    assert_names(message, f"--out_dir {out}", named, "another --out_dir")
    assert not names(message, "--resume")  # nothing to continue: --resume is not offered
    with pytest.raises(CheckpointError) as refused:
        plan_run(parse_args(tiny_run_args(shakespeare_dir, out, resume=True)), probe_machine())
    assert_names(str(refused.value), "--resume", str(out), "--resume auto")

    plan = plan_run(parse_args(tiny_run_args(shakespeare_dir, out, resume="auto")), probe_machine())
    assert plan.resume is None
    (said,) = [line for line in plan.notes if "--resume auto" in line]
    assert_names(said, str(out), named, "afresh")
    if leftover == "metrics.jsonl":  # no record names a run id: the file's time stamp does
        assert re.search(r"metrics move to metrics\.jsonl\.attempt-\d{8}-\d{6},", said), said
    assert sorted(p.name for p in out.iterdir()) == [leftover]


def gone_owner() -> dict:
    """A lock owner on this host whose process is gone (pid 2**22 + 1 is above pid_max)."""
    owner = LockOwner.this_process("x")
    return {**owner.__dict__, "pid": 2**22 + 1, "identity": None}


@pytest.mark.slow
def test_a_requeue_after_a_kill_before_the_first_checkpoint_starts_afresh(
    shakespeare_dir, launch, tmp_path
):
    """Two launches of one command (--resume auto, 2 ranks, --save_interval 200) into a fresh
    out dir, the first SIGKILLed (every process, as a lost node does) after a few iterations,
    before its first checkpoint: the second starts afresh and trains to the end (exit 0),
    logging each iteration once; the first's records are kept apart (read_attempts, the plot)
    and equal the second's where both trained: the same run from the same seed."""
    out = tmp_path / "run"
    args = tiny_run_args(shakespeare_dir, out, resume="auto", save_interval=200, max_iters=8)
    first = launch(args, "killed")  # DeepSpeed's launcher and its ranks: one process group
    first.wait_for(lambda: len(logged_iters(out)) >= 3, "three logged iterations")
    first.processes()
    os.killpg(first.proc.pid, signal.SIGKILL)
    assert first.finish() != 0
    assert not list(out.glob("*/gpt_ds.json")) and (out / LOCK_NAME).exists()
    killed = read_metrics(out, tolerate_partial_last_line=True)
    killed_id = killed[0]["run_id"]

    second = launch(args, "requeued", lean=True).finish_ok()
    (said,) = [line for line in second.output.splitlines() if line.startswith("--resume auto:")]
    assert_names(said, str(out), "metrics.jsonl", "afresh", f"metrics.jsonl.attempt-{killed_id}")
    assert logged_iters(out) == list(range(1, 9))
    assert sorted(p.parent.name for p in out.glob("*/gpt_ds.json")) == ["final"]
    attempts = read_attempts(out)
    assert list(attempts) == [killed_id]
    before = {r["iter"]: r["loss"] for r in attempts[killed_id] if r.get("kind") == "train"}
    now = {r["iter"]: r["loss"] for r in read_metrics(out) if r.get("kind") == "train"}
    assert len(before) >= 3 and before == {i: now[i] for i in before}
    assert {r["run_id"] for r in read_metrics(out)} == {second_run_id(out)} != {killed_id}
    plotted = load_run(out)
    assert plotted.train_iters == list(range(1, 9))
    assert plotted.attempts == {killed_id: (sorted(before), [before[i] for i in sorted(before)])}


def logged_iters(out: Path) -> list[int]:
    records = read_metrics(out, tolerate_partial_last_line=True)
    return [r["iter"] for r in records if r.get("kind") == "train"]


def second_run_id(out: Path) -> str:
    return json.loads((out / "final" / "gpt_ds.json").read_text())["run_id"]
