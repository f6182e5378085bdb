"""End-to-end training with real DeepSpeed ranks (gloo on CPU) on Tiny Shakespeare.

References are computed independently in each test: a one-process `transformers` evaluation of
the consolidated weights (DeepSpeed's own zero_to_fp32). Exact resume is test_faults'.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from harness.launch import STAGE_RUN_ITERS, run_deepspeed, run_python
from helpers.files import HELLASWAG_MINI
from helpers.hellaswag import reference_scores
from helpers.logged import train_losses
from support.launch import REPO, tiny_run_args
from support.runs import consolidated_model

from gpt_ds.observe.metrics_file import read_metrics

pytestmark = pytest.mark.slow


def eval_records(out_dir) -> list[dict]:
    return [r for r in read_metrics(out_dir) if "val_loss" in r]


def reference_val_loss(model, val_bin, block_size: int, windows: int) -> float:
    """Token-weighted mean loss over evenly spaced val windows, one process, plain torch."""
    tokens = np.memmap(val_bin, dtype=np.uint16, mode="r")
    starts = np.linspace(0, len(tokens) - block_size - 1, num=windows).round().astype(int)
    total, count = 0.0, 0
    with torch.no_grad():
        for s in starts:
            w = torch.from_numpy(tokens[s : s + block_size + 1].astype(np.int64))
            logits = model(input_ids=w[None, :-1]).logits[0]
            total += torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum").item()
            count += block_size
    return total / count


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_zero_stage_trains_and_loss_falls(stage, stage_run):
    out, stdout = stage_run(stage)
    assert "rank 1/2" in stdout
    losses = train_losses(out)
    assert sorted(losses) == list(range(1, 25))
    first, last = np.mean([losses[i] for i in (1, 2)]), np.mean([losses[i] for i in (23, 24)])
    assert first > 10.0  # ~ln(50257) at initialisation
    assert last < first - 2.5, f"loss did not fall clearly: {first:.3f} -> {last:.3f}"
    evals = eval_records(out)
    assert [e["iter"] for e in evals] == [10, 20, 24]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert (out / "latest").read_text() == "final"
    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())
    assert manifest["zero_stage"] == stage and manifest["world_size"] == 2
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"iter_10", "iter_20", "final"}
    assert_whole_rank_lines(stdout, world=2)


BANNER = re.compile(r"rank (\d+)/(\d+) on host ")


def assert_whole_rank_lines(stdout: str, world: int) -> None:
    """Each rank's start-up banner is a line of its own, and no line holds a second rank's
    banner: the ranks' writes did not run into one another."""
    banners = [line for line in stdout.splitlines() if BANNER.search(line)]
    assert sorted(int(BANNER.search(b).group(1)) for b in banners) == list(range(world)), banners
    for line in banners:
        assert BANNER.match(line) and len(BANNER.findall(line)) == 1, line


def test_log_level_quiets_rank_0_but_keeps_every_rank_line(shakespeare_dir, tmp_path):
    """`--log_level warning`: no model line, no training or eval lines; each rank's banner
    still, whole; the run trains as asked (its metrics.jsonl is the record)."""
    out = tmp_path / "quiet"
    args = tiny_run_args(
        shakespeare_dir, out, max_iters=2, warmup_iters=1, eval_interval=0, eval_iters=1
    )
    stdout = run_deepspeed([*args, "--log_level", "warning"]).stdout
    assert_whole_rank_lines(stdout, world=2)
    assert "model gpt2-tiny:" not in stdout and " | loss " not in stdout, stdout[-3000:]
    assert sorted(train_losses(out)) == [1, 2]


def test_distributed_eval_equals_one_process_reference(shakespeare_dir, stage_run):
    """The ZeRO-2 stage run's last evaluation, on 2 ranks, against one process's."""
    out, _ = stage_run(2)
    logged = eval_records(out)[-1]
    assert logged["iter"] == STAGE_RUN_ITERS
    model = consolidated_model(out, "final")
    # eval_iters 4 x micro_batch 4 (tiny_run_args') = 16 windows, 8 per rank
    ref = reference_val_loss(model, shakespeare_dir / "val.bin", 64, windows=16)
    assert math.isclose(logged["val_loss"], ref, rel_tol=0, abs_tol=2e-5), (logged, ref)
    assert math.isclose(logged["val_ppl"], math.exp(ref), rel_tol=1e-4)


def test_eval_with_uneven_windows_per_rank(shakespeare_dir, tmp_path):
    """5 windows on 2 ranks (3 + 2, one zero-weight padded batch) == one-process reference."""
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir, out, micro_batch_size=1, max_iters=6, eval_interval=0, eval_iters=5
    )
    run_deepspeed(args, num_gpus=2)
    two_rank = eval_records(out)[-1]["val_loss"]
    ref = reference_val_loss(consolidated_model(out, "final"), shakespeare_dir / "val.bin", 64, 5)
    assert math.isclose(two_rank, ref, rel_tol=0, abs_tol=2e-5), (two_rank, ref)


def test_plain_python_runs_one_rank(shakespeare_dir, tmp_path):
    """`python gpt_ds/train.py` trains as a world of one and evaluates like the reference."""
    out = tmp_path / "one"
    args = tiny_run_args(
        shakespeare_dir, out, max_iters=4, eval_interval=2, eval_iters=3, hellaswag=HELLASWAG_MINI
    )
    proc = run_python([str(REPO / "gpt_ds" / "train.py"), *args])
    assert "rank 0/1" in proc.stdout
    assert sorted(train_losses(out)) == [1, 2, 3, 4]
    last = eval_records(out)[-1]
    model = consolidated_model(out, "final")
    ref = reference_val_loss(model, shakespeare_dir / "val.bin", 64, 12)
    assert math.isclose(last["val_loss"], ref, rel_tol=0, abs_tol=2e-5), (last["val_loss"], ref)
    expected = reference_scores(model, 64)  # HellaSwag on one rank too
    assert {key: last[key] for key in expected} == expected


def test_deepspeed_module_launch(shakespeare_dir, tmp_path):
    """`deepspeed --module gpt_ds.train` runs the installed package like the script path."""
    out = tmp_path / "module"
    args = tiny_run_args(
        shakespeare_dir, out, max_iters=2, warmup_iters=0, eval_interval=0, eval_iters=1
    )
    proc = run_deepspeed(args, num_gpus=1, script="gpt_ds.train", extra_launcher_args=["--module"])
    assert "rank 0/1" in proc.stdout and "done: 2 iterations" in proc.stdout
    assert sorted(train_losses(out)) == [1, 2]
    assert (out / "latest").read_text() == "final"


@pytest.mark.parametrize("stage", [2, 3])
def test_init_from_pretrained_directory(stage, shakespeare_dir, tmp_path):
    """--init_from loads a Hugging Face GPT-2 directory: with a negligible lr, the run's val
    loss is the pretrained model's own, computed here with plain transformers. Under ZeRO-3
    transformers fills the partitioned model's shards as it reads the weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    pretrained = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64))
    pretrained.save_pretrained(tmp_path / "pretrained")
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir,
        out,
        init_from=tmp_path / "pretrained",
        deepspeed_config=f"ds_configs/zero{stage}.json",
        model=None,
        block_size=None,
        max_iters=2,
        warmup_iters=0,
        eval_interval=0,
        eval_iters=2,
        lr=1e-12,
        no_checkpoint=True,
    )
    proc = run_deepspeed(args, num_gpus=2)
    assert "2 layers, 2 heads, 64 wide, block 64" in proc.stdout
    ref = reference_val_loss(pretrained.eval(), shakespeare_dir / "val.bin", 64, windows=8)
    assert math.isclose(eval_records(out)[-1]["val_loss"], ref, abs_tol=1e-4)
