"""Gradient accumulation, proven: a rank's training windows do not depend on how its batch is
split into micro-batches (gpt_ds.data.tokens.TrainWindows, fast tests), so `--micro_batch_size 2
--grad_accum 4` trains as `--micro_batch_size 8 --grad_accum 1` to float rounding under
ZeRO-1/2/3 (real 2-rank runs, helpers.compared_runs); a resume with accumulation is exact;
evaluations and checkpoints land on optimizer steps, counted as DeepSpeed counts them in its own
engine state."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.launch import run_deepspeed
from helpers.compared_runs import (
    BASE,
    ITERS,
    WHOLE,
    assert_losses_close,
    assert_weights_close,
)
from helpers.logged import train_losses, train_lrs, val_losses
from helpers.messages import assert_names
from support.launch import tiny_run_args
from support.runs import consolidated_model

from gpt_ds.base.errors import DataError
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.data.tokens import GlobalSplit, TrainWindows
from gpt_ds.observe.metrics_file import read_metrics

BLOCK = 16
# token i is i: a window's first token is its start offset
TOKENS = np.arange(20_000, dtype=np.uint16)
# the evaluation set is eval_iters x micro_batch_size x grad_accum windows: 16 in both
SPLIT = {"micro_batch_size": 2, "grad_accum": 4, "eval_iters": 2}


def train_windows(batch: int, rank: int = 0, seed: int = 7) -> TrainWindows:
    """Rank `rank`'s windows of a run of `rank + 1` ranks, one micro-batch of `batch` a step."""
    return TrainWindows(TOKENS, BLOCK, batch, seed, rank, GlobalSplit(rank + 1, 1))


def draw(s: TrainWindows, times: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(s.next_batch() for _ in range(times)), strict=True)
    return torch.cat(xs), torch.cat(ys)


# ---------------------------------------------------------------------- the training windows
def test_a_split_batch_draws_the_same_sequences():
    x8, y8 = draw(train_windows(8), 3)  # 3 steps of micro-batch 8
    x2, y2 = draw(train_windows(2), 12)  # the same 3 steps as 4 micro-batches of 2
    assert torch.equal(x2, x8) and torch.equal(y2, y8)
    assert len(set(x8[:, 0].tolist())) == 24  # 24 different windows


def test_windows_are_the_split_at_their_starts():
    s = train_windows(64)
    x, y = s.next_batch()
    starts = x[:, 0].numpy()
    assert np.array_equal(starts, s.starts(0, 64))
    for row, start in enumerate(starts):
        window = torch.from_numpy(TOKENS[start : start + BLOCK + 1].astype(np.int64))
        assert torch.equal(x[row], window[:-1]) and torch.equal(y[row], window[1:])
    assert starts.min() >= 0 and starts.max() < len(TOKENS) - BLOCK - 1
    assert np.array_equal(train_windows(4).starts(10, 6), s.starts(0, 16)[10:])  # any stretch


def test_the_stream_is_the_runs_its_seed_decides_and_it_covers_the_split():
    base = train_windows(1).starts(0, 100)
    assert np.array_equal(base, train_windows(1, rank=1).starts(0, 100))  # not the rank's
    assert not np.array_equal(base, train_windows(1, seed=8).starts(0, 100))
    assert np.array_equal(base, train_windows(1).starts(0, 100))  # and nothing else
    counts = np.bincount(train_windows(1).starts(0, 50_000) * 10 // (len(TOKENS) - BLOCK - 1))
    assert len(counts) == 10 and counts.min() > 4_700 and counts.max() < 5_300  # uniform


def test_state_counts_sequences_and_resumes_the_stream():
    s = train_windows(4)
    draw(s, 3)
    state = s.state_dict()
    assert state == {
        "seed": 7, "rank": 0, "stream": "global", "sequences": 12, "micro_batch_size": 4
    }  # fmt: skip
    resumed = train_windows(2)  # another split continues the same stream
    resumed.load_state_dict(state)
    assert torch.equal(draw(resumed, 2)[0], draw(s, 1)[0])
    with pytest.raises(DataError) as other_seed:
        train_windows(4, seed=8).load_state_dict(state)
    assert_names(str(other_seed.value), "seed", "7", "8")  # what differs, both values


def global_steps(world: int, micro: int, accum: int, steps: int, seed: int = 7):
    """(each step's window starts, ranks and micro-batches in order; each step's hash) of
    fresh global-stream windows split over `world` ranks x `accum` micro-batches of `micro`."""
    split = GlobalSplit(world, accum)
    ranks = [TrainWindows(TOKENS, BLOCK, micro, seed, rank=r, split=split) for r in range(world)]
    starts, hashes = [], []
    for _ in range(steps):
        step = [w.next_batch()[0][:, 0].tolist() for w in ranks for _ in range(accum)]
        starts.append(sum(step, []))
        hashes.append(ranks[0].last_step_hash())
        assert all(w.last_step_hash() == hashes[-1] for w in ranks)  # no communication
    return starts, hashes


def test_the_global_stream_gives_every_split_of_a_global_batch_the_same_sequences():
    """Issue 25: sequence i of a run is a pure function of (seed, i), each step the next
    global batch of 8 split among the ranks: 2 ranks x 4, 1 x 4 x 2 accumulated, 8 x 1, ...
    train each step on the same sequences, in the same order."""
    ref, ref_hashes = global_steps(2, 4, 1, steps=3)
    for world, micro, accum in [(1, 4, 2), (1, 8, 1), (2, 2, 2), (4, 1, 2), (8, 1, 1)]:
        assert global_steps(world, micro, accum, steps=3) == (ref, ref_hashes), (world, accum)
    one = TrainWindows(TOKENS, BLOCK, 24, seed=7, rank=0, split=GlobalSplit(1, 1))
    assert sum(ref, []) == one.starts(0, 24).tolist()  # the stream's sequences 0..23 in order
    assert len(set(ref_hashes)) == 3 and global_steps(2, 4, 1, 3, seed=8)[1] != ref_hashes


def test_a_global_stream_state_resumes_on_another_world_size_and_keeps_its_kind():
    two = [TrainWindows(TOKENS, BLOCK, 4, 7, rank=r, split=GlobalSplit(2, 1)) for r in (0, 1)]
    for _ in range(2):  # two steps of 8
        for w in two:
            w.next_batch()
    state = two[1].state_dict()
    assert (state["stream"], state["sequences"]) == ("global", 16)
    one = TrainWindows(TOKENS, BLOCK, 4, 7, rank=0, split=GlobalSplit(1, 2))
    one.load_state_dict(state)
    step3 = torch.cat([one.next_batch()[0] for _ in range(2)])
    assert step3[:, 0].tolist() == global_steps(2, 4, 1, steps=3)[0][2]
    with pytest.raises(DataError) as other_stream:
        one.load_state_dict({**state, "stream": "per_rank"})  # an older gpt_ds's rank state
    assert_names(str(other_stream.value), "per_rank", "global")


# ---------------------------------------------------------------------------- real runs
@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_accumulation_trains_as_a_larger_micro_batch(stage, runs):
    """4 micro-batches of 2 per step == 1 of 8: the same sequences, losses, learning rates,
    evaluations and final weights, to float rounding (the gradient is summed in another
    order)."""
    split, whole = runs(stage, **SPLIT), runs(stage, **WHOLE)
    assert_losses_close(split, whole)
    assert train_lrs(split) == train_lrs(whole)
    vals_split, vals_whole = val_losses(split), val_losses(whole)
    assert sorted(vals_split) == sorted(vals_whole) == [2, 4]
    # a real learning rate: it trains (step 1 runs at DeepSpeed's warm-up start, lr 0)
    assert vals_whole[4] < vals_whole[2] - 0.3, vals_whole
    for it in (2, 4):
        assert math.isclose(vals_split[it], vals_whole[it], rel_tol=1e-5)
    tokens = [{r["iter"]: r["tokens"] for r in read_metrics(out) if r.get("kind") == "train"}
              for out in (split, whole)]  # fmt: skip
    assert tokens[0] == tokens[1] == {i: i * 2 * 8 * 64 for i in range(1, ITERS + 1)}
    assert_weights_close(split, whole)


def engine_state(out: Path, tag: str, stage: int) -> dict:
    """DeepSpeed's own engine state in `tag` (ZeRO-3: rank 0's model-states file)."""
    name = "zero_pp_rank_0_mp_rank_00" if stage == 3 else "mp_rank_00"
    return torch.load(out / tag / f"{name}_model_states.pt", weights_only=False, mmap=True)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_evaluations_and_checkpoints_land_on_optimizer_steps(stage, runs):
    """With --grad_accum 4 and --eval_interval 2, a step is 4 micro-batches: evaluations at
    steps 2 and 4 (not micro-step 2), a checkpoint whose iteration is DeepSpeed's own count
    of optimizer steps, and the run's global stream 16 sequences (2 ranks x 8) further per
    step, in every rank's state alike."""
    out = runs(stage, **SPLIT)
    records = read_metrics(out)
    assert [r["iter"] for r in records if r.get("kind") == "eval"] == [2, 4]
    assert [r["tag"] for r in records if r.get("event") == "checkpoint"] == ["iter_2", "final"]
    for tag, it in (("iter_2", 2), ("final", 4)):
        assert Manifest.read(out / tag).iteration == it
        state = engine_state(out, tag, stage)
        assert (state["global_steps"], state["global_samples"]) == (it, it * 2 * 8)
        for rank in (0, 1):
            rank_state = torch.load(out / tag / f"gpt_ds_rank{rank}.pt", weights_only=False)
            # the training windows' state: the file key keeps its old name
            windows = rank_state["sampler"]
            assert (windows["stream"], windows["sequences"]) == ("global", it * 16)


@pytest.mark.slow
def test_resume_with_accumulation_is_exact(runs, shakespeare_dir, tmp_path):
    """Steps 3-4 resumed from the `iter_2` checkpoint of a --grad_accum 4 run (ZeRO-2) ==
    the uninterrupted run's: identical losses, evaluation and weights."""
    ref = runs(2, **SPLIT)
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(ref / "iter_2", out / "iter_2")
    (out / "latest").write_text("iter_2")
    args = {**SPLIT, "deepspeed_config": "ds_configs/zero2.json", "resume": True}
    args = tiny_run_args(shakespeare_dir, out, **{**BASE, **args})
    proc = run_deepspeed(args)
    assert f"resumed from {out}/iter_2 at iteration 2" in proc.stdout
    got, expected = train_losses(out), train_losses(ref)
    assert sorted(got) == [3, 4]
    assert [got[i] for i in (3, 4)] == [expected[i] for i in (3, 4)]
    assert val_losses(out) == {4: val_losses(ref)[4]}
    wa = consolidated_model(ref, "final").state_dict()
    wb = consolidated_model(out, "final").state_dict()
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
