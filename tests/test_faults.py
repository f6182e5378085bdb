"""Crashes, preemption, full disks, bad numbers and resizing, with real DeepSpeed ranks on CPU.

Every run here is a real launch (`deepspeed --num_gpus 2 gpt_ds/train.py ...`, or
`python gpt_ds/train.py` for one rank) started in the background by `harness.launch.Launch`, so
a test can kill a rank, signal the launcher, or watch the run's files while it works. Where the
test is about the trainer (a killed or stopped rank, a full disk), the launch is lean: the
suite's node launcher with ranks forked by its zygote (`Launch`'s `lean`); where it is about
DeepSpeed's launcher or runner (signals to them, a kill of the whole process group), theirs.
References are computed in each test module: uninterrupted runs of the same configuration
(`References`), DeepSpeed's own zero_to_fp32 for weights, and plain `transformers` for a loss.

/dev/shm: DeepSpeed's CPU comm op would leave a ~66 MB buffer per rank of a multi-rank launch,
which no rank removes and a SIGKILLed rank could not; gpt_ds's ranks never build that op
(gpt_ds.base.dist.init). Every 2-rank test asserts that its run leaves nothing there: after a
normal end, an error exit after start-up (non-finite loss, full disk), a SIGTERM/SIGINT stop,
and a SIGKILL. `Launch` would remove a run's buffers at teardown, after the test has looked.

Measured exit codes (DeepSpeed 0.19.8, local launch, recorded in the assertions below):
- a rank SIGKILLed: the launcher (`deepspeed.launcher.launch`) exits with the first non-zero
  rank status it polls, -9 (shell status 247) or the survivor's 1; `deepspeed` passes it on;
- SIGTERM to the launcher: every rank saves and exits 0, the launcher exits 1 anyway
  (its handler ends in `sys.exit(1)`);
- SIGTERM to `deepspeed` itself is not forwarded on a local launch: it dies at once (status
  -15). The ranks watch for that (gpt_ds/training/trainer.py): they stop as for SIGTERM,
  save, exit 0, and the orphaned launcher exits 0 after them;
- SIGINT to the whole process group (Ctrl-C): ranks save and exit 0; `deepspeed` dies of the
  KeyboardInterrupt at once, before the ranks finish saving.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.launch import Launch
from helpers.logged import train_losses, train_lrs, val_losses
from helpers.messages import assert_names, names
from helpers.system import mount, umount
from support.launch import REPO, launch_env, tiny_run_args
from support.runs import consolidated_model
from transformers import GPT2LMHeadModel

from gpt_ds.checkpoint.integrity import file_digest
from gpt_ds.export.hf import export_checkpoint
from gpt_ds.observe.metrics_file import read_metrics

pytestmark = pytest.mark.slow

# A 2-layer, 64-wide GPT-2 (3.3M parameters, 51 MB per checkpoint): ~12 s per 2-rank launch.
SMALL = {"n_layer": 2, "n_head": 2, "n_embd": 64}
# 8 iterations with checkpoints at 2, 4, 6 and `final`; the schedule is fixed by
# lr_decay_iters, so a run given a longer --max_iters trains the same first 8 iterations.
SCHEDULE = {"max_iters": 8, "lr_decay_iters": 8, "warmup_iters": 2, "eval_interval": 2}
ITERS = 8
# One 64-token window a rank a step: what an exact resume needs, at a quarter of the tokens (the
# LM head's 50,304 rows are most of a step's work, and all of a bf16 step's where the CPU
# emulates bf16). Not for `zero2`, the stops' reference: the signals and the launch watch land
# within its 8 steps at their pace.
FEW_TOKENS = {"micro_batch_size": 1}
PRESET = {stage: {"deepspeed_config": f"ds_configs/zero{stage}.json"} for stage in (1, 2, 3)}


# ---------------------------------------------------------------------------- launching
# ---------------------------------------------------------------------------- run records
def checkpoint_iters(out: Path) -> list[int]:
    """Checkpoints logged so far (the run may be writing its next line)."""
    records = read_metrics(out, tolerate_partial_last_line=True)
    return [r["iter"] for r in records if r.get("event") == "checkpoint"]


def logged_iters(out: Path) -> list[int]:
    """Iterations logged so far (the run may be writing its next line)."""
    return [r["iter"] for r in read_metrics(out, tolerate_partial_last_line=True) if "loss" in r]


def read_metrics_file(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def latest(out: Path) -> str:
    return (out / "latest").read_text().strip()


def complete_tags(out: Path) -> list[str]:
    return sorted(p.parent.name for p in out.glob("*/gpt_ds.json"))


def copy_checkpoint(src: Path, tag: str, dst: Path) -> None:
    """A fresh run directory holding one complete checkpoint of another, named by `latest`."""
    dst.mkdir(parents=True)
    shutil.copytree(src / tag, dst / tag)
    (dst / "latest").write_text(tag)


def assert_same_weights(out_a: Path, out_b: Path, tag: str = "final") -> None:
    wa = consolidated_model(out_a, tag).state_dict()
    wb = consolidated_model(out_b, tag).state_dict()
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"{name} differs"


def assert_save_failed(text: str, out: Path, cause: str) -> None:
    """A failed save of iter_4 is said in one line with the tag, the out dir, its cause and the
    free space there, the intact checkpoint `latest` still names (iter_2), and the way on."""
    parts = ("'iter_4'", str(out), cause, "MiB", "`latest`", "iter_2", "--resume")
    said = [line for line in text.splitlines() if "error:" in line and "'iter_4'" in line]
    assert said, text[-4000:]
    assert any(all(names(line, part) for part in parts) for line in said), said


def batch_loss(out: Path, tag: str, data_dir: Path, sequences: int, global_batch: int) -> float:
    """Mean loss of the weights in `tag` on the run's next global batch after `sequences`.

    One process, plain transformers: sequence i of the run's global stream is a pure function
    of (seed, i) (gpt_ds.data.tokens.TrainWindows), so this is what a resumed run must log
    first, on any world size."""
    from gpt_ds.data.tokens import GlobalSplit, TrainWindows
    from gpt_ds.model.gpt2 import lm_loss

    model = consolidated_model(out, tag)
    tokens = np.memmap(data_dir / "train.bin", dtype=np.uint16, mode="r")
    one_rank = GlobalSplit(world_size=1, grad_accum=global_batch)  # a sequence at a time
    windows = TrainWindows(tokens, block_size=64, batch_size=1, seed=1337, rank=0, split=one_rank)
    windows.sequences = sequences
    with torch.no_grad():
        losses = [lm_loss(model, *windows.next_batch()).item() for _ in range(one_rank.grad_accum)]
    return sum(losses) / len(losses)


def batch_hashes(out: Path) -> dict[int, str]:
    """iteration -> the logged hash of its global batch (metrics.jsonl's `batch`)."""
    return {r["iter"]: r["batch"] for r in read_metrics(out) if "batch" in r}


# ---------------------------------------------------------------------------- references
@dataclass
class Reference:
    """An uninterrupted run: `args(out, ...)` gives the same run for another directory."""

    overrides: dict
    data_dir: Path
    out: Path
    losses: dict[int, float] = field(default_factory=dict)
    vals: dict[int, float] = field(default_factory=dict)
    lrs: dict[int, float] = field(default_factory=dict)

    def args(self, out: Path, **more) -> list[str]:
        return tiny_run_args(self.data_dir, out, **{**self.overrides, **more})


class References:
    """Uninterrupted 8-iteration runs, each launched once per module on first use."""

    SPECS = {
        "zero1": {**PRESET[1], "dropout": 0.1, **FEW_TOKENS},
        "zero2": PRESET[2],
        "zero2_few": {**PRESET[2], **FEW_TOKENS},
        "zero2_dropout": {**PRESET[2], "dropout": 0.1, **FEW_TOKENS},
        "zero3": {**PRESET[3], **FEW_TOKENS},
        "zero2_bf16": {**PRESET[2], "precision": "bf16", **FEW_TOKENS},
        "zero2_muon": {**PRESET[2], "optimizer": "muon", **FEW_TOKENS},
        "zero3_muon": {**PRESET[3], "optimizer": "muon", **FEW_TOKENS},
    }

    def __init__(self, data_dir: Path, root: Path):
        self.data_dir, self.root = data_dir, root
        self.done: dict[str, Reference] = {}

    def get(self, name: str) -> Reference:
        if name not in self.done:
            overrides = {**SMALL, **SCHEDULE, "eval_iters": 2, **self.SPECS[name]}
            ref = Reference(overrides, self.data_dir, self.root / name)
            run = Launch(ref.args(ref.out), self.root / f"{name}.log", runner=False, lean=True)
            try:
                run.finish_ok()
            finally:
                run.cleanup()
            ref.losses, ref.vals, ref.lrs = (
                train_losses(ref.out),
                val_losses(ref.out),
                train_lrs(ref.out),
            )
            assert sorted(ref.losses) == list(range(1, ITERS + 1))
            self.done[name] = ref
        return self.done[name]


@pytest.fixture(scope="module")
def refs(shakespeare_dir, tmp_path_factory) -> References:
    return References(shakespeare_dir, tmp_path_factory.mktemp("references"))


# ---------------------------------------------------------------------------- 1. exact resume
@pytest.mark.parametrize(
    "name", ["zero1", "zero2_dropout", "zero3", "zero2_bf16", "zero2_muon", "zero3_muon"]
)
def test_resume_is_exact(name, refs, launch, tmp_path):
    """K iterations, --resume, K more == 2K in one go: identical losses, identical weights.

    The resumed run starts from the checkpoint the uninterrupted run wrote at K (what a K-only
    run leaves behind, minus a launch). ZeRO-1 and ZeRO-2 run with dropout, so the per-rank
    RNG streams are restored too; the Muon runs restore Muon's momentum with the optimizer.
    """
    ref = refs.get(name)
    out = tmp_path / "resumed"
    copy_checkpoint(ref.out, "iter_4", out)
    run = launch(ref.args(out, resume=True), "resume", lean=True).finish_ok()
    assert f"resumed from {out}/iter_4 at iteration 4" in run.output
    got = train_losses(out)
    assert sorted(got) == [5, 6, 7, 8]
    # bf16 too: the same operations in the same order give the same bits (measured here)
    assert [got[i] for i in got] == [ref.losses[i] for i in got]
    assert val_losses(out) == {i: ref.vals[i] for i in (6, 8)}
    assert_same_weights(ref.out, out)


def test_bf16_follows_fp32_within_bf16_noise(refs):
    """The same run in bf16 and in fp32 (the chunked loss, the bf16 optimizer wrapper, the
    upcasts on the way): every training and eval loss within 1% of fp32's, bf16's 8-bit
    mantissa (0.4% per rounding) accumulated over a few steps, and both falling."""
    fp32, bf16 = refs.get("zero2_few"), refs.get("zero2_bf16")
    assert sorted(bf16.losses) == sorted(fp32.losses)
    for i, loss in fp32.losses.items():
        assert bf16.losses[i] == pytest.approx(loss, rel=0.01), (i, bf16.losses[i], loss)
    assert bf16.losses[ITERS] < bf16.losses[1] - 0.3 and fp32.losses[ITERS] < fp32.losses[1] - 0.3
    for i, loss in fp32.vals.items():
        assert bf16.vals[i] == pytest.approx(loss, rel=0.01), (i, bf16.vals[i], loss)
    assert bf16.losses != fp32.losses  # it did run in bf16


# ---------------------------------------------------------------------------- 2. SIGKILL
def test_sigkill_a_rank_mid_training_then_resume(refs, launch, tmp_path):
    """kill -9 of one rank while it trains: the run fails, the last complete checkpoint is
    intact and `latest`, and --resume reproduces the uninterrupted run exactly."""
    ref = refs.get("zero2")
    out = tmp_path / "run"
    run = launch(ref.args(out, max_iters=1000), "killed", lean=True)
    run.wait_for(lambda: 4 in checkpoint_iters(out), "the checkpoint at iteration 4")
    run.rank(1).kill()
    rc = run.finish()
    assert rc in (247, 1), rc  # the launcher's exit: rank 1's -9, or rank 0's 1 if polled first
    # rank 0 noticed in its next collective: gloo says closed (EOF) or reset (mid-read)
    assert re.search(r"Connection (closed|reset) by peer", run.output), run.tail()
    saved = checkpoint_iters(out)
    assert saved[-1] >= 4 and latest(out) == f"iter_{saved[-1]}"
    assert run.shm() == []  # no /dev/shm buffer, not even the SIGKILLed rank's
    run.cleanup()

    resumed = launch(ref.args(out, resume=True), "resume", lean=True).finish_ok()
    assert f"resumed from {out}/iter_{saved[-1]} at iteration {saved[-1]}" in resumed.output
    assert train_losses(out) == ref.losses
    assert_same_weights(ref.out, out)
    # the killed launch's records past the checkpoint went aside: each iteration logged once
    assert logged_iters(out) == list(range(1, ITERS + 1))
    aside = out / f"metrics.jsonl.rewound-{saved[-1]}"
    if aside.exists():
        assert all(r["iter"] > saved[-1] for r in read_metrics_file(aside))


# 2 layers, 128 wide: 111 MB per checkpoint, a save stays open ~0.3 s on this CPU, a window
# the 5 ms poll below hits; SMALL's 51 MB saves take ~40 ms, a coin toss.
SLOW_SAVE = {"n_layer": 2, "n_head": 2, "n_embd": 128}


@pytest.mark.parametrize("victims", ["rank 0", "every rank"])
def test_sigkill_mid_save_keeps_the_previous_checkpoint(victims, shakespeare_dir, launch, tmp_path):
    """kill -9 while `iter_4.partial/` is being written, of rank 0 (the rank that publishes)
    or of every process at once (an OOM killer, a lost node): `latest` still names iter_2.

    A surviving rank removes the staging directory and says why; with no survivor it stays,
    and --resume reports it, ignores it, resumes from iter_2 and recomputes iterations 3-4
    exactly (then overwrites the leftover when it saves iter_4 again).
    """
    common = {**SLOW_SAVE, **SCHEDULE, "eval_iters": 2}
    for attempt in range(3):  # a kill that lands after the rename proves nothing: try again
        out = tmp_path / f"run{attempt}"
        args = tiny_run_args(shakespeare_dir, out, **{**common, "max_iters": 1000})
        # every rank: one SIGKILL to the launch's process group, so DeepSpeed's launcher
        run = launch(args, "killed", lean=victims == "rank 0")
        partial = out / "iter_4.partial"
        run.wait_for(lambda p=partial: any(p.glob("*_states.pt")), "DeepSpeed to write iter_4")
        if victims == "rank 0":
            run.rank(0).kill()
        else:
            run.processes()
            os.killpg(run.proc.pid, signal.SIGKILL)
        rc = run.finish()
        if not (out / "iter_4").exists():
            break
        run.cleanup()
    else:
        pytest.fail("three kills in a row landed after the save had completed")
    assert rc != 0
    assert latest(out) == "iter_2" and complete_tags(out) == ["iter_2"]
    logged = train_losses(out)
    assert {3, 4} <= set(logged)  # it trained past the checkpoint it will resume from
    assert run.shm() == []  # no /dev/shm buffer, not even the SIGKILLed ranks'
    run.cleanup()
    if victims == "rank 0":
        (said,) = [line for line in run.output.splitlines() if "[rank 1] error:" in line]
        assert_names(said, "'iter_4'", "--resume")  # the save that failed, and the way on
        assert "another rank" in said  # the cause: rank 0's, not its own
        assert not partial.exists()
        return  # what is left is the "every rank" case minus the partial directory

    assert partial.is_dir()
    args = tiny_run_args(shakespeare_dir, out, **{**common, "max_iters": 6}, resume=True)
    resumed = launch(args, "resume", lean=True).finish_ok()
    assert f"ignoring incomplete checkpoint directory {partial} (no manifest)" in resumed.output
    assert f"resumed from {out}/iter_2 at iteration 2" in resumed.output
    again = train_losses(out)
    assert again[3] == logged[3] and again[4] == logged[4]  # the same steps, recomputed
    assert not partial.exists() and latest(out) == "final"
    assert complete_tags(out) == ["final", "iter_2", "iter_4"]


# ---------------------------------------------------------------------------- 3. saving on time
ON_TIME = "--save_every_minutes"


def test_save_every_minutes_saves_on_time_on_every_rank_at_one_iteration(
    shakespeare_dir, launch, tmp_path
):
    """--save_every_minutes 0.01 (0.6 s) in a run without step-count saves (--eval_interval 0)
    and --keep_last 2: on-time checkpoints come no sooner than 0.6 s after the previous one,
    each said with its reason before it is written; every rank wrote its share at the same
    iteration (each rank's file holds the data position of the manifest's iteration);
    --keep_last prunes them as any iter_* tag."""
    out = tmp_path / "run"
    flags = {**SMALL, "max_iters": 24, "eval_interval": 0, "keep_last": 2}
    args = tiny_run_args(shakespeare_dir, out, **flags, save_every_minutes=0.01)
    run = launch(args, "on_time", lean=True).finish_ok()
    saves = [r for r in read_metrics(out) if r.get("event") == "checkpoint"]
    on_time = [r for r in saves if ON_TIME in r["why"]]
    assert len(on_time) >= 2, run.tail()
    assert saves[-1]["tag"] == "final" and len(on_time) == len(saves) - 1
    # the final save ends the run whenever it ends: only the on-time ones keep the interval
    for earlier, later in zip(on_time, on_time[1:], strict=False):  # 10 ms: the ranks' clocks
        assert later["time"] - earlier["time"] >= 0.6 - 0.01, (earlier, later)
    # the vote in flight during a save (cast before it) does not ask for another save; read a
    # step late, the next vote that can is two iterations on
    iters = [r["iter"] for r in on_time]
    assert all(b - a >= 2 for a, b in zip(iters, iters[1:], strict=False)), iters
    for r in on_time:
        said = f"checkpoint {r['tag']}: saving (0.01 minutes since the last save, {ON_TIME})"
        assert said in run.output
    kept = [r["tag"] for r in on_time[-2:]]
    assert complete_tags(out) == sorted(["final", *kept])
    for r in on_time[:-2]:
        assert f"checkpoint: removed {r['tag']} (--keep_last 2)" in run.output
    for tag in kept:
        manifest = json.loads((out / tag / "gpt_ds.json").read_text())
        for rank in (0, 1):
            state = torch.load(out / tag / f"gpt_ds_rank{rank}.pt", weights_only=False)
            assert state["sampler"]["sequences"] == manifest["iteration"] * 8, (tag, rank)


# ---------------------------------------------------------------------------- 4. signals
STOPPED = re.compile(r"stopped at iteration (\d+); resume with --resume \(tag iter_(\d+)\)")


def test_sigterm_and_sigint_stop_cleanly_and_resume(refs, launch, tmp_path):
    """SIGTERM to DeepSpeed's launcher (it forwards it to the ranks), then Ctrl-C (SIGINT to
    every process of the group) during the resumed run: each time every rank finishes its
    step, a checkpoint is saved, the ranks exit 0 and leave nothing in /dev/shm; the resumed
    run's iterations equal the uninterrupted run's bit for bit."""
    ref = refs.get("zero2")
    out = tmp_path / "run"
    first = launch(ref.args(out), "sigterm", runner=True)
    first.wait_for(lambda: max(logged_iters(out), default=0) >= 2, "iteration 2")
    first.launcher().send_signal(signal.SIGTERM)
    assert first.finish() == 1  # launch.py's handler exits 1 after its ranks exited 0
    assert "received SIGTERM: saving" in first.output
    m = STOPPED.search(first.output)
    assert m, first.tail()
    n = int(m.group(1))
    assert latest(out) == f"iter_{n}" and 2 <= n < ITERS - 1
    assert "exits with return code" not in first.output  # no rank failed
    assert first.shm() == []

    second = launch(ref.args(out, resume=True), "sigint", runner=True)
    second.wait_for(lambda: logged_iters(out)[-1] > n, "an iteration after the resume")
    second.processes()  # remember the ranks: `deepspeed` dies at once on Ctrl-C
    os.killpg(second.proc.pid, signal.SIGINT)
    rc = second.finish()
    # `deepspeed` dies of its KeyboardInterrupt (-SIGINT), or, where it reaps launch.py's exit
    # (1, from that process's own SIGINT handler) first, exits with it: seen once in CI under
    # load. Either is DeepSpeed's runner; the ranks' behaviour is what is checked below.
    assert rc in (-signal.SIGINT, 1), rc
    assert f"resumed from {out}/iter_{n} at iteration {n}" in second.output
    # the ranks get SIGINT from the terminal, then SIGTERM from the launcher, which the log
    # names (the last signal before the step's stop-flag all-reduce)
    assert re.search(r"received SIG(INT|TERM): saving", second.output), second.tail()
    m = STOPPED.search(second.output)
    assert m, second.tail()
    n2 = int(m.group(1))
    assert n < n2 < ITERS and latest(out) == f"iter_{n2}"
    assert complete_tags(out) == sorted({f"iter_{i}" for i in (2, 4, 6, n, n2) if i <= n2})
    assert second.shm() == []
    got = train_losses(out)
    assert sorted(got) == list(range(1, n2 + 1))
    assert got == {i: ref.losses[i] for i in got}


def test_a_signal_to_one_rank_stops_every_rank_and_rank_0_says_why(refs, launch, tmp_path):
    """SIGTERM to rank 1 alone (a node's OOM guard, a scheduler that signals one process): the
    ranks agree to stop, save once and exit 0; rank 0's log, the one a user reads, names the
    rank that was asked and why."""
    ref = refs.get("zero2")
    out = tmp_path / "run"
    run = launch(ref.args(out, max_iters=1000), "one_rank", lean=True)
    run.wait_for(lambda: max(logged_iters(out), default=0) >= 2, "iteration 2")
    run.rank(1).send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.tail()
    assert "rank 1: received SIGTERM: saving" in run.output, run.tail()
    m = STOPPED.search(run.output)
    assert m and latest(out) == f"iter_{m[1]}", run.tail()
    assert run.shm() == []


def test_sigterm_to_the_deepspeed_command_stops_the_orphaned_ranks(refs, launch, tmp_path):
    """A scheduler's requeue: the job's command has `--resume auto`, so its first launch starts
    the run; SIGTERM to the pid the job script knows, `deepspeed` itself: DeepSpeed's runner
    dies at once without telling its launcher; the ranks notice within a second that the
    process that started the launch is gone, finish the step, save and exit 0, and the launcher
    after them. The same command again continues: equal to the uninterrupted run bit for bit."""
    ref = refs.get("zero2")
    out = tmp_path / "run"
    job = ref.args(out, resume="auto")
    first = launch(job, "runner_sigterm", runner=True)
    first.wait_for(lambda: max(logged_iters(out), default=0) >= 2, "iteration 2")
    ranks = [first.rank(0), first.rank(1)]
    launcher = first.launcher()
    first.proc.send_signal(signal.SIGTERM)
    assert first.finish() == -signal.SIGTERM  # the runner: killed by the signal, at once
    for p in [*ranks, launcher]:  # finish() waited for them: all exited, and cleanly
        assert not p.is_running()
    assert f"the process that started the launch (pid {first.proc.pid}) is gone: saving" in (
        first.output
    )
    m = STOPPED.search(first.output)
    assert m, first.tail()
    n = int(m.group(1))
    assert latest(out) == f"iter_{n}" and 2 <= n < ITERS
    assert "exits with return code" not in first.output  # every rank exited 0
    assert first.shm() == []
    assert f"--resume auto: no checkpoint in {out}: starting the run" in first.output

    resumed = launch(job, "requeued", lean=True).finish_ok()
    assert f"resumed from {out}/iter_{n} at iteration {n}" in resumed.output
    assert train_losses(out) == ref.losses
    assert_same_weights(ref.out, out)


# ---------------------------------------------------------------------------- 5. disk
def test_full_disk_fails_clearly_and_keeps_the_previous_checkpoint(refs, launch, tmp_path):
    """A 80 MB tmpfs holds one 51 MB checkpoint, not two: the save at iteration 4 fails with a
    message naming the full disk, the run exits non-zero, and iter_2 stays `latest`,
    complete and bit-identical to the uninterrupted run's iter_2."""
    ref = refs.get("zero2")
    disk = tmp_path / "disk"
    disk.mkdir()
    why = mount("-t", "tmpfs", "-o", "size=80m", "tmpfs", str(disk))
    if why:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {why}")
    try:
        out = disk / "out"
        run = launch(ref.args(out), "full", lean=True)
        rc = run.finish()
        assert rc == 2, rc  # the ranks' own exit code for a gpt_ds error
        text = run.output
        assert_save_failed(text, out, "no space left")
        assert "Traceback" not in text
        assert latest(out) == "iter_2" and complete_tags(out) == ["iter_2"]
        assert not (out / "iter_4").exists()
        assert run.shm() == []  # error exit after start-up: no /dev/shm buffer
        assert_same_weights(ref.out, out, "iter_2")
    finally:
        umount(disk)


def _chattr(flag: str, path: Path) -> str | None:
    """chattr(1) FLAG PATH; the reason it failed, or None."""
    if not shutil.which("chattr"):
        return "no chattr (e2fsprogs)"
    proc = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


def test_permission_error_while_saving_keeps_the_previous_checkpoint(refs, launch, tmp_path):
    """--out_dir stops accepting new entries after the checkpoint at iteration 2 (`chattr +i`:
    even root gets EPERM, where chmod would not stop it): the save at 4 fails naming the error,
    the run exits 2, iter_2 stays `latest` and intact; once fixed, --resume continues from it
    exactly like the uninterrupted run."""
    ref = refs.get("zero2")
    out = tmp_path / "run"
    out.mkdir()
    run = launch(ref.args(out), "eperm", lean=True)
    run.wait_for(lambda: 2 in checkpoint_iters(out), "the checkpoint at iteration 2")
    why = _chattr("+i", out)
    if why:
        pytest.skip(f"cannot make a directory immutable here: {why}")
    try:
        rc = run.finish()
    finally:
        _chattr("-i", out)
    assert rc == 2, run.tail()
    text = run.output
    assert_save_failed(text, out, f"Operation not permitted: {out}/iter_4.partial")  # strerror
    assert "Traceback" not in text
    assert latest(out) == "iter_2" and complete_tags(out) == ["iter_2"]
    assert not list(out.glob("iter_4*"))
    assert run.shm() == []
    assert_same_weights(ref.out, out, "iter_2")

    resumed = launch(ref.args(out, resume=True), "resume", lean=True).finish_ok()
    assert f"resumed from {out}/iter_2 at iteration 2" in resumed.output
    assert train_losses(out) == ref.losses


def test_read_only_out_dir_fails_before_training(shakespeare_dir, launch, tmp_path):
    """--out_dir on a read-only filesystem (a read-only bind mount; root ignores chmod):
    a clear error and exit 2 before any rank starts."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    why = mount("--bind", str(src), str(ro))
    if why:
        pytest.skip(f"cannot bind-mount here: {why}")
    try:
        why = mount("-o", "remount,bind,ro", str(ro))
        if why:
            pytest.skip(f"cannot remount read-only here: {why}")
        out = ro / "out"
        run = launch(tiny_run_args(shakespeare_dir, out, **SMALL), "ro", num_gpus=1, lean=True)
        assert run.finish() == 2
        assert_names(run.output, f"--out_dir {out}", "Read-only file system")  # strerror
        assert "rank 0/1" not in run.output  # failed before the process group and the model
    finally:
        umount(ro)


# ---------------------------------------------------------------------------- 6. NaN
@pytest.mark.parametrize(
    "lr, ranks, precision, what",
    [
        (1e30, 2, "fp32", "loss became nan"),
        (1e6, 1, "fp32", r"(?:loss|the gradient norm) became (?:inf|nan)"),
        (1e6, 2, "bf16", r"(?:loss|the gradient norm) became (?:inf|nan)"),
    ],
    ids=["nan-loss", "inf-grads", "inf-grads-bf16"],
)
def test_non_finite_training_stops_without_saving(
    lr, ranks, precision, what, shakespeare_dir, launch, tmp_path
):
    """An absurd learning rate, two warm-up steps (the first two steps run at lr 0): the
    checkpoint at iteration 2 is good, then the weights blow up. At lr 1e30 the loss turns
    NaN; at 1e6 it stays finite (~1e12) while the gradients overflow. DeepSpeed's own fp32 step
    would skip every such step silently; gpt_ds's sync-free one (training/engine_build.py) does not,
    as bf16's does not (its overflow check off): gpt_ds reads the gradient norm. Either way the
    run stops naming iter_2 and saves nothing after it, though the loss and norm are read only
    at log lines and before evaluations and saves. One sequence of 32 tokens a micro-batch:
    the blow-up does not depend on the batch, and bf16 is emulated on CPUs without AVX-512 BF16
    (every token costs)."""
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir, out, **SMALL, **SCHEDULE, eval_iters=2, lr=lr, precision=precision,
        log_interval=3, micro_batch_size=1, block_size=32,
    )  # fmt: skip
    run = launch(args, "nan", num_gpus=ranks, lean=True)
    assert run.finish() == 2
    pattern = (
        rf"error: {what} at iteration (\d+); stopping without saving "
        rf"\(the last good checkpoint is {re.escape(str(out))}/iter_2\)"
    )
    m = re.search(pattern, run.output)
    assert m, run.tail()
    assert int(m.group(1)) > 2
    assert latest(out) == "iter_2" and complete_tags(out) == ["iter_2"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["iter_2"]
    assert checkpoint_iters(out) == [2]
    assert run.shm() == []  # error exit after start-up: no /dev/shm buffer


# ---------------------------------------------------------------------------- 8. resizing
UNIVERSAL_TOOL = REPO / "tools" / "universal_checkpoint.py"


def test_a_muon_checkpoint_resumes_as_muon_on_its_world_size_and_seeds_any_run(
    refs, launch, tmp_path
):
    """A Muon checkpoint: another optimizer, or another world size (DeepSpeed's universal
    checkpoint has no Muon state), is refused before any build with the way on, and nothing
    is written; the way on, `--init_from` its weights, fine-tunes with Muon, and its
    export computes the logits of DeepSpeed's own consolidation (tests/test_muon.py checks the
    split; test_resume_is_exact the resume)."""
    ref = refs.get("zero2_muon")
    out = tmp_path / "resumed"
    copy_checkpoint(ref.out, "iter_4", out)
    adamw = launch(ref.args(out, resume=True, optimizer="adamw"), "adamw", lean=True)
    assert adamw.finish() == 2
    assert_names(
        adamw.output, f"{out}/iter_4", "muon run", "optimizer is adamw", "--optimizer muon",
        f"--init_from {out}:iter_4",
    )  # fmt: skip
    one_rank = launch(ref.args(out, resume=True, grad_accum=2), "one_rank", num_gpus=1, lean=True)
    assert one_rank.finish() == 2
    assert_names(
        one_rank.output, "saved by 2 ranks", "this run has 1", "universal checkpoint", "Muon",
        "exp_avg", "resume with 2 ranks", f"--init_from {out}:iter_4",
    )  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["iter_4", "latest"]  # nothing written

    tuned = tmp_path / "tuned"
    shape = {"model": None, "n_layer": None, "n_head": None, "n_embd": None}  # the weights'
    seeded = ref.args(tuned, init_from=f"{ref.out}:final", max_iters=2, **shape)
    run = launch(seeded, "init_from", lean=True).finish_ok()
    assert f"init: weights of {ref.out}:final (iteration {ITERS})" in run.output
    assert val_losses(tuned)[0] == pytest.approx(ref.vals[ITERS], rel=1e-5)
    assert sorted(train_losses(tuned)) == [1, 2]
    assert "hidden-muon-params: Muon, 8 tensors" in run.output, run.tail()

    hf = tmp_path / "hf"
    export_checkpoint(ref.out, hf, tag="final", progress=False, log=None)
    exported = GPT2LMHeadModel.from_pretrained(hf, dtype=torch.float32).eval()
    reference = consolidated_model(ref.out, "final").eval()
    tokens = torch.randint(
        0, reference.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        torch.testing.assert_close(exported(tokens).logits, reference(tokens).logits)


@pytest.mark.parametrize("name", ["zero2_bf16", "zero3"])
def test_resume_on_another_world_size(name, refs, launch, shakespeare_dir, tmp_path):
    """2 ranks -> 1 -> 2 through automatic universal conversion, the global batch kept (1 rank
    accumulates 2 micro-batches): every step trains on the uninterrupted run's sequences (the
    same batch hashes), so its losses are the uninterrupted run's to reduction-order noise, and
    no --allow_batch_change is needed. A changed global batch is still refused without it.
    ZeRO-2 in bf16 (the GPU default; DeepSpeed's bf16 master weights), ZeRO-3 in fp32.
    """
    ref = refs.get(name)
    out = tmp_path / "resized"
    copy_checkpoint(ref.out, "iter_4", out)

    refused = launch(ref.args(out, resume=True, max_iters=6), "refused", num_gpus=1, lean=True)
    assert refused.finish() == 2
    assert (
        "error: resuming iter_4 changes the batch: world size 2 -> 1\n"
        "  global batch 2 -> 1 sequences per step (128 -> 64 tokens); the 4 steps so far saw "
        "512 tokens\n"
        "  data: the global stream goes on where it stopped, each step its next 1 sequence "
        "split among 1 rank: the same order of sequences, 2 -> 1 a step\n"
        "  a resume is exact only with the saved batch: resume with 2 ranks, "
        "--micro_batch_size 1 --grad_accum 1; to accept the change, pass --allow_batch_change"
    ) in refused.output, refused.tail()
    assert sorted(p.name for p in out.iterdir()) == ["iter_4", "latest"]  # nothing written

    one = launch(
        ref.args(out, resume=True, max_iters=6, grad_accum=2), "to_one", num_gpus=1, lean=True
    )
    one.finish_ok()
    assert (
        "resuming iter_4 changes the batch: world size 2 -> 1, gradient accumulation 1 -> 2"
        in one.output
    )
    assert "each step its next 2 sequences split among 1 rank" in one.output
    assert "--allow_batch_change" not in one.output
    assert "iter_4 was saved by 2 ranks, this run has 1: converting it" in one.output
    assert f"resumed from {out}/iter_4_universal at iteration 4" in one.output
    losses = train_losses(out)
    expected = batch_loss(ref.out, "iter_4", shakespeare_dir, sequences=8, global_batch=2)
    # fp32: measured equal to the last bit (the conversion restores the fp32 weights exactly);
    # bf16: the run computes in bf16, this reference in fp32
    assert math.isclose(losses[5], expected, abs_tol=1e-6 if name == "zero3" else 2e-2), (
        losses[5],
        expected,
    )
    assert losses[5] == ref.losses[5]

    two = launch(ref.args(out, resume=True), "to_two", lean=True).finish_ok()
    assert "each step its next 2 sequences split among 2 ranks" in two.output
    assert "final was saved by 1 ranks, this run has 2: converting it" in two.output
    assert f"resumed from {out}/final_universal at iteration 6" in two.output
    losses = train_losses(out)
    assert batch_hashes(out) == {i: batch_hashes(ref.out)[i] for i in range(5, 9)}
    # the same sequences, gradients summed in another order: reduction-order noise (ZeRO-2
    # measured bit-identical). ZeRO-3 drifted 1.7e-4, 2.8e-3, 5.1e-3 at 6-8 until the repair of
    # DeepSpeed's universal load (its sub-groups shared one Adam step counter)
    tolerance = 1e-5
    for i in range(5, 9):
        assert losses[i] == pytest.approx(ref.losses[i], rel=tolerance), (i, losses[i], ref.losses)
    assert train_lrs(out) == {i: ref.lrs[i] for i in (5, 6, 7, 8)}
    tokens = {r["iter"]: r["tokens"] for r in read_metrics(out) if r.get("kind") == "train"}
    assert tokens == {5: 640, 6: 768, 7: 896, 8: 1024}, tokens
    assert val_losses(out)[8] == pytest.approx(ref.vals[8], rel=tolerance)

    # `final` was rewritten by the 2-rank run: its old universal conversion must not be reused
    proc = subprocess.run(
        [sys.executable, str(UNIVERSAL_TOOL), str(out), "--tag", "final"],
        cwd=REPO,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "final_universal"
    manifest = json.loads((out / "final_universal" / "gpt_ds.json").read_text())
    assert (manifest["iteration"], manifest["world_size"], manifest["universal"]) == (8, 2, True)


def test_universal_checkpoint_tool(refs, launch, tmp_path):
    """tools/universal_checkpoint.py: converts `latest` (or --tag), prints the new tag; a
    missing or incomplete tag is `error: ...` and exit 2. The universal tag lists its own files
    with their sha256 (`sha256sum` the reference): one flipped byte in its largest file is
    refused by `--resume`, naming the file, and a conversion made again replaces it."""
    ref = refs.get("zero2")
    out = tmp_path / "run"
    copy_checkpoint(ref.out, "iter_4", out)
    (out / "iter_6").mkdir()  # a directory without a manifest: not a checkpoint

    def tool(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(UNIVERSAL_TOOL), str(out), *args]
        return subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True)

    proc = tool()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "iter_4_universal"
    manifest = json.loads((out / "iter_4_universal" / "gpt_ds.json").read_text())
    assert manifest["universal"] and manifest["source_tag"] == "iter_4"
    assert manifest["iteration"] == 4
    assert (out / "iter_4_universal" / "zero").is_dir()  # DeepSpeed's per-parameter layout
    assert not (out / "iter_4_universal.partial").exists()
    assert not (out / "latest_universal").exists()
    assert latest(out) == "iter_4"  # converting does not move `latest`
    universal = out / "iter_4_universal"
    names = sorted(manifest["files"])
    assert "gpt_ds_rank0.pt" in names and any(n.startswith("zero/") for n in names)
    sha = subprocess.run(["sha256sum", *names], cwd=universal, capture_output=True, text=True)
    assert manifest["checksums"] == dict(
        reversed(x.split("  ", 1)) for x in sha.stdout.splitlines()
    )
    largest = max(names, key=lambda n: manifest["files"][n])
    with (universal / largest).open("r+b") as f:  # one byte flipped, the size kept
        f.seek(manifest["files"][largest] // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    args = ref.args(out, resume="iter_4_universal", max_iters=6, grad_accum=2)
    refused = launch(args, "damaged_universal", num_gpus=1, lean=True)
    assert refused.finish() == 2, refused.tail()
    assert_names(refused.output, largest, "sha256")
    assert "verified" not in refused.output
    assert tool("--tag", "iter_4").returncode == 0  # damaged: converted again
    assert file_digest(universal / largest) == manifest["checksums"][largest]

    complete = "iter_4, iter_4_universal"
    for args, named in [
        (["--tag", "iter_6"], [f"{out}/iter_6", "gpt_ds.json"]),  # the tag, the file it lacks
        (["--tag", "iter_9"], ["--tag iter_9", str(out), complete]),  # and the tags there are
    ]:
        proc = tool(*args)
        assert proc.returncode == 2, proc.stderr
        assert_names(proc.stderr, *named)
    (out / "latest").unlink()
    proc = tool()
    assert proc.returncode == 2
    assert_names(proc.stderr, "`latest`", "--tag", complete)


# ---------------------------------------------------------------------------- 9. hangs
HANG_TIMEOUT = 6


@pytest.mark.parametrize("stopped", [1, 0])
def test_a_stopped_rank_is_named_within_the_timeout(stopped, refs, launch, tmp_path):
    """Issue 25: SIGSTOP one rank mid-training (rank 0 too, which hosts the c10d store): within
    --hang_timeout the other writes its stacks, names the silent rank and its last phase, and
    the run exits non-zero; no checkpoint is written or lost, and the run resumes."""
    ref = refs.get("zero2")
    out = tmp_path / "run"
    run = launch(ref.args(out, max_iters=1000, hang_timeout=HANG_TIMEOUT), "hung", lean=True)
    run.wait_for(lambda: 6 in checkpoint_iters(out), "the checkpoint at iteration 6")
    saved = checkpoint_iters(out)
    run.rank(stopped).suspend()
    stopped_at = time.monotonic()
    report = out / "hang" / "report.txt"
    run.wait_for(report.exists, "the hang report", timeout=HANG_TIMEOUT + 20, poll=0.1)
    took = time.monotonic() - stopped_at  # the timeout, a heartbeat, the next phase's start
    assert HANG_TIMEOUT - 1 < took < HANG_TIMEOUT + 10, took
    # DeepSpeed's launcher then gives the stopped rank 30 s for its SIGTERM: spare the suite
    run.rank(stopped).kill()
    rc = run.finish(timeout=120)
    other = 1 - stopped
    assert rc != 0, run.tail()
    line = next(ln for ln in run.output.splitlines() if "error: hang at iter" in ln)
    assert line == f"error: {report.read_text().strip()}"
    iteration = int(re.search(r"hang at iter (\d+)", line)[1])
    assert iteration > saved[-1], line  # it was stopped while training, after that save
    assert f"rank {stopped} silent since" in line and f"rank {other} wait in" in line, line
    # its last phase: work of that iteration, or the save or evaluation that closed the one
    # before (rank 0 still finishes the save, `latest` and the metrics event, after the
    # checkpoint's directory appears, and may be stopped there while rank 1 went on)
    last_phases = [
        f"last in {phase}"
        for phase in (
            f"forward and backward of iter {iteration}",
            f"all_reduce of iter {iteration}",
            f"engine step of iter {iteration}",
            f"save iter_{iteration - 1}",
            f"evaluation at iter {iteration - 1}",
        )
    ]
    assert any(phase in line for phase in last_phases), line
    assert f"{out}/hang/rank<N>.txt" in line, line
    stacks = (out / "hang" / f"rank{other}.txt").read_text()
    assert f"rank {other}, pid" in stacks and "most recent call first" in stacks, stacks
    assert not (out / "hang" / f"rank{stopped}.txt").exists()
    run.cleanup()
    assert checkpoint_iters(out)[: len(saved)] == saved  # the watchdog wrote none, lost none
    if stopped == 0:
        return  # one resume is enough (rank 1's run below)
    last, tag = checkpoint_iters(out)[-1], latest(out)
    resumed = launch(
        ref.args(out, resume=True, max_iters=last + 2), "resumed", lean=True
    ).finish_ok()
    assert f"resumed from {out}/{tag} at iteration {last}" in resumed.output
