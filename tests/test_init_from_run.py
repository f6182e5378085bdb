"""Continue from an earlier run on new data: `--init_from OUT_DIR[:TAG]` starts a new run from a
checkpoint's weights (iteration 0, fresh optimizer and schedule, its own out dir), at another
ZeRO stage and world size; its first evaluation (at iteration 0) equals the earlier run's at
that checkpoint. `--resume` onto other data or another model is refused, naming --init_from."""

from __future__ import annotations

import json
import shutil

import pytest
from harness.launch import STAGE_RUN_ITERS, run_deepspeed, run_python, train_fails
from helpers.logged import train_lrs, val_losses
from helpers.messages import assert_names
from support.launch import REPO, TRAIN, tiny_run_args

from gpt_ds.base import cli
from gpt_ds.commands.pick_preset import PickPresetOptions
from gpt_ds.observe.metrics_file import read_metrics

# no --model: the shape comes from the weights
NEW_RUN = {"model": None, "max_iters": 2, "eval_interval": 0, "warmup_iters": 2}


@pytest.mark.slow
def test_zero3_run_continues_in_one_zero2_process(stage_run, shakespeare_dir, tmp_path):
    """A 2-rank ZeRO-3 run's latest (`final`, iteration 24) into one ZeRO-2 process."""
    source = stage_run(3)[0]
    out = tmp_path / "new"
    args = tiny_run_args(shakespeare_dir, out, init_from=str(source), **NEW_RUN)
    stdout = run_python([str(TRAIN), *args], timeout=300).stdout
    assert f"init: weights of {source}:final (iteration {STAGE_RUN_ITERS})" in stdout
    first_eval = val_losses(out)[0]
    assert first_eval == pytest.approx(val_losses(source)[STAGE_RUN_ITERS], rel=1e-5)
    records = read_metrics(out)
    trained = [r for r in records if r.get("kind") == "train"]
    assert [r["iter"] for r in trained] == [1, 2]  # a new run: iteration 0 onwards
    assert trained[0]["tokens"] == 4 * 64  # one rank, micro-batch 4, block 64: counted anew
    # a fresh schedule: the warmup from 0 to 2e-3 over 2 steps (the lr each step used)
    assert train_lrs(out) == {1: 0.0, 2: pytest.approx(1e-3)}
    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())
    assert (manifest["iteration"], manifest["world_size"], manifest["zero_stage"]) == (2, 1, 2)
    assert manifest["model"]["vocab_size"] == 50257  # the exported weights, GPT-2's own rows
    assert not (out / ".init_weights").exists()  # the staging export is gone


@pytest.mark.slow
def test_a_named_tag_continues_on_two_zero1_ranks(stage_run, shakespeare_dir, tmp_path):
    source = stage_run(2)[0]
    out = tmp_path / "new"
    args = tiny_run_args(
        shakespeare_dir,
        out,
        init_from=f"{source}:iter_10",
        deepspeed_config="ds_configs/zero1.json",
        **NEW_RUN,
    )
    run_deepspeed(args, num_gpus=2)
    assert val_losses(out)[0] == pytest.approx(val_losses(source)[10], rel=1e-5)
    assert sorted(val_losses(out)) == [0, 2]


@pytest.mark.slow
def test_init_from_refuses_its_own_out_dir_and_a_missing_tag(stage_run, shakespeare_dir):
    source = stage_run(2)[0]
    into_itself = tiny_run_args(shakespeare_dir, source, init_from=f"{source}:final", model=None)
    err = train_fails(into_itself)
    assert_names(err, f"--init_from {source}:final", "--out_dir", "--resume")  # and the way on
    missing = tiny_run_args(shakespeare_dir, source, init_from=f"{source}:iter_99", model=None)
    err = train_fails(missing)
    assert_names(err, "--init_from", "iter_99", "iter_10, iter_20, final")  # the tags there


@pytest.mark.slow
def test_resume_on_other_data_names_init_from(stage_run, shakespeare_dir, tmp_path):
    """The same run resumed with a --data_dir prepared from other text is refused."""
    other = tmp_path / "other"
    text = tmp_path / "other.txt"
    text.write_text("".join(f"line {i} of another corpus, not Shakespeare.\n" for i in range(3000)))
    prepare = REPO / "tools" / "prepare_data.py"
    run_python([str(prepare), "--input", str(text), "--out_dir", str(other)], timeout=120)
    run = shutil.copytree(stage_run(2)[0], tmp_path / "run")
    err = train_fails(tiny_run_args(other, run, resume=True, max_iters=30, allow_batch_change=True))
    saved = json.loads((run / "final" / "gpt_ds.json").read_text())["data"]["train_tokens"]
    now = json.loads((other / "meta.json").read_text())["train_tokens"]
    # the checkpoint, the split that differs with both sizes, and the command for a new run
    assert_names(err, f"{run}/final", "train_tokens", str(saved), str(now))
    assert_names(err, f"--init_from {run}:final --out_dir NEW_DIR")


@pytest.mark.slow
def test_the_picker_reads_a_runs_shape_from_its_checkpoint(stage_run):
    source = stage_run(2)[0]
    flags = ["--gpus_per_node", "2", "--gpu_memory_gb", "16", "--global_batch_size", "8"]
    options = cli.parse(PickPresetOptions, ["--init_from", f"{source}:iter_10", *flags])
    saved = json.loads((source / "iter_10" / "gpt_ds.json").read_text())["model"]
    shape = options.model_shape()
    assert (shape.n_layer, shape.n_embd, shape.block_size) == (
        saved["n_layer"], saved["n_embd"], saved["block_size"]
    )  # fmt: skip
    assert shape.vocab_size == 50257  # what the new run trains: GPT-2's own rows
