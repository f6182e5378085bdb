"""A run's length in tokens or epochs (`--max_tokens`, `--max_epochs`): turned into whole
optimizer steps from the run's own batch, conflicting flags refused; the log counts epochs."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from harness.launch import run_python
from helpers.messages import assert_names
from support.launch import TRAIN, tiny_run_args

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.resolve import run_length
from gpt_ds.dsconfig.settings import DEFAULT_MAX_ITERS
from gpt_ds.launch.machine import probe_machine
from gpt_ds.observe.metrics_file import read_metrics
from gpt_ds.run.config import length_problems, parse_args


def cfg(*flags: str):
    return parse_args(["--model", "gpt2-tiny", *flags])


def test_a_token_budget_rounds_up_to_whole_steps():
    asked = cfg("--max_tokens", "1000")
    length = run_length(asked, tokens_per_iter=256, train_tokens=10**6)
    assert (length.max_iters, length.decay_iters) == (4, 4)  # 1000 / 256 = 3.9
    assert length.line == "run length: 4 iterations from --max_tokens 1,000 (256 tokens each)"
    assert asked.max_iters is None  # the config keeps what was asked


def test_an_epoch_budget_counts_the_train_split():
    length = run_length(cfg("--max_epochs", "2.5"), tokens_per_iter=1000, train_tokens=10_001)
    assert length.max_iters == 26  # ceil(25_002.5 -> 25_003 tokens / 1000)


def test_a_length_in_steps_is_the_flag_or_the_default():
    assert run_length(cfg(), 256, 10**6).max_iters == DEFAULT_MAX_ITERS
    length = run_length(cfg("--max_iters", "30", "--lr_decay_iters", "20"), 256, 10**6)
    assert (length.max_iters, length.decay_iters, length.line) == (30, 20, None)


def test_conflicting_or_bad_budgets_are_named():
    (both,) = length_problems(cfg("--max_tokens", "10", "--max_epochs", "1"))
    assert_names(both, "--max_tokens", "--max_epochs")
    (both,) = length_problems(cfg("--max_iters", "50", "--max_epochs", "1"))
    assert_names(both, "--max_iters", "--max_epochs")
    (zero,) = length_problems(cfg("--max_epochs", "0"))
    assert_names(zero, "--max_epochs", "> 0", "0.0")  # the flag, the bound, the value
    # the default's value given on purpose is still a conflict
    (both,) = length_problems(cfg("--max_iters", "200", "--max_tokens", "10"))
    assert_names(both, "--max_iters", "--max_tokens")
    decay_beyond = dataclasses.replace(cfg("--max_tokens", "512"), lr_decay_iters=10)
    with pytest.raises(ConfigError) as e:
        run_length(decay_beyond, tokens_per_iter=256, train_tokens=10**6)
    # the flag and its value, the run's steps, and the budget they come from
    assert_names(str(e.value), "--lr_decay_iters 10", "2", "--max_tokens")


def test_a_launch_resolves_each_thing_once(shakespeare_dir, tmp_path, monkeypatch):
    """A --max_tokens run planned in this process, as a launch plans it: one model-shape
    resolution, one check of the run's settings, one DeepSpeed config resolution, one length
    resolution (no stand-in length first); its schedule spans the steps its resolved batch
    gives the budget."""
    from gpt_ds.dsconfig import resolve
    from gpt_ds.run import config, plan

    calls: dict[str, int] = {}

    def counted(module, name: str) -> None:
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(config, "resolve_shape")
    counted(resolve.RunSettings, "problems")
    counted(plan, "resolve_ds_config")
    counted(resolve, "run_length")
    facts = probe_machine()  # once, before: train.py's main() probes, plan_run reads
    flags = ["--data_dir", str(shakespeare_dir), "--out_dir", str(tmp_path / "run"),
             "--block_size", "64", "--micro_batch_size", "4", "--grad_accum", "2",
             "--max_tokens", "5000", "--precision", "fp32"]  # fmt: skip
    planned = plan.plan_run(cfg(*flags), facts)
    assert calls == {"resolve_shape": 1, "problems": 1, "resolve_ds_config": 1, "run_length": 1}
    assert planned.length.max_iters == math.ceil(5000 / (4 * 2 * 64)) == 10
    assert planned.ds.config["scheduler"]["params"]["total_num_steps"] == 10


@pytest.mark.parametrize(
    "length, named",
    [
        (["--max_iters", "1000", "--lr_decay_iters", "100"], "--lr_decay_iters"),
        (["--max_iters", "100"], "--max_iters"),
        (["--max_tokens", str(100 * 4 * 64)], "--max_tokens"),  # micro-batch 4 x block 64
    ],
)
def test_a_warmup_past_the_schedule_names_the_flag_of_its_span(
    length, named, shakespeare_dir, tmp_path
):
    """The warm-up, its 100-step schedule, and the flag that set that span."""
    from gpt_ds.run.plan import plan_run

    flags = ["--data_dir", str(shakespeare_dir), "--out_dir", str(tmp_path / "run"),
             "--block_size", "64", "--micro_batch_size", "4", "--precision", "fp32",
             "--warmup_iters", "200", *length]  # fmt: skip
    with pytest.raises(ConfigError) as e:
        plan_run(cfg(*flags), probe_machine())
    (warmup,) = [p for p in e.value.problems if "--warmup_iters" in p]
    assert_names(warmup, "200", "100", named)


@pytest.mark.slow
def test_a_run_trains_for_a_share_of_an_epoch(shakespeare_dir, tmp_path):
    train_tokens = json.loads((shakespeare_dir / "meta.json").read_text())["train_tokens"]
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir, out, max_iters=None, max_epochs=0.005, eval_interval=0, eval_iters=1
    )
    stdout = run_python([str(TRAIN), *args], timeout=300).stdout
    iters = math.ceil(math.ceil(0.005 * train_tokens) / 256)  # micro-batch 4 x block 64, 1 rank
    assert f"run length: {iters} iterations from --max_epochs 0.005" in stdout
    train = [r for r in read_metrics(out) if r.get("kind") == "train"]
    assert train[-1]["iter"] == iters
    assert train[-1]["epoch"] == pytest.approx(iters * 256 / train_tokens, abs=1e-4)
    assert f"epoch {train[-1]['epoch']:.2f}" in stdout
