"""Early stopping (`--early_stop_patience`): the rule on its own, then a real run whose val loss
rises (lr far too high) stops, saves `final`, names the best tag, `--tag best` exports it, and a
resumed run carries the count on."""

from __future__ import annotations

import json

import pytest
from harness.launch import run_deepspeed, run_python
from helpers.logged import val_losses
from support.launch import REPO, tiny_run_args

from gpt_ds.observe.metrics_file import read_metrics
from gpt_ds.training.trainer import EarlyStop


def test_patience_counts_evaluations_without_a_large_enough_improvement():
    rule = EarlyStop(patience=2, min_delta=0.1)
    assert not rule.observe(5.0, 10)  # the first is the best
    assert not rule.observe(4.95, 20)  # better, but by less than min_delta: stale 1
    assert not rule.observe(4.8, 30)  # better by 0.2: the new best
    assert (rule.best, rule.best_iter, rule.stale) == (4.8, 30, 0)
    assert not rule.observe(4.9, 40)
    assert rule.observe(4.75, 50)  # 0.05 better: not enough, second in a row
    assert "2 evaluations without a val loss below 4.8000 (iteration 30)" in rule.reason()


def test_the_count_survives_a_checkpoint_and_off_never_stops():
    rule = EarlyStop(patience=3)
    for it, loss in enumerate([3.0, 3.1, 3.2], start=1):
        rule.observe(loss, it)
    resumed = EarlyStop(patience=3)
    resumed.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert resumed.observe(3.3, 4)  # the third stale evaluation, counted across the save
    off = EarlyStop(patience=0)
    assert not any(off.observe(float(i), i) for i in range(10))


@pytest.mark.slow
def test_a_diverging_run_on_two_ranks_stops_early_and_exports_best(shakespeare_dir, tmp_path):
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir,
        out,
        lr=0.05,  # far too high for this model: the val loss rises after the first steps
        warmup_iters=0,
        max_iters=40,
        eval_interval=2,
        eval_iters=2,
        early_stop_patience=2,
    )
    stdout = run_deepspeed(args, num_gpus=2).stdout
    vals = val_losses(out)
    best_iter = min(vals, key=vals.get)
    stopped = max(vals)
    assert stopped < 40 and sorted(vals)[-3:] == [best_iter, best_iter + 2, best_iter + 4]
    final = json.loads((out / "final" / "gpt_ds.json").read_text())
    assert (final["iteration"], final["best_tag"]) == (stopped, f"iter_{best_iter}")
    assert f"best checkpoint: {out}/iter_{best_iter}" in stdout
    events = [r for r in read_metrics(out) if r.get("event") == "early_stop"]
    assert [e["iter"] for e in events] == [stopped]

    export = tmp_path / "best"
    run_python([str(REPO / "tools" / "zero_to_fp32.py"), str(out), "--tag", "best", "--output",
                str(export)], timeout=300)  # fmt: skip
    assert json.loads((export / "gpt_ds_export.json").read_text())["tag"] == f"iter_{best_iter}"

    # resumed, the stale count goes on: the next evaluation stops it again
    stdout = run_deepspeed([*args, "--resume"], num_gpus=2).stdout
    assert f"stopped early at iteration {stopped + 2}" in stdout
