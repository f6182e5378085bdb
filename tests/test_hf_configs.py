"""DeepSpeed configs written for the Hugging Face Trainer work unchanged with gpt_ds: every "auto"
is filled with the value transformers' own HfTrainerDeepSpeedConfig fills for the same run.

tests/data/hf_ds_config_zero2.json and hf_ds_config_zero3.json are the "ZeRO-2 Example" and
"ZeRO-3 Example" auto-configuration files of the transformers DeepSpeed guide, copied verbatim:
https://github.com/huggingface/transformers/blob/main/docs/source/en/main_classes/deepspeed.md
(sections #deepspeed-zero2-example and #deepspeed-zero3-example; the ZeRO-3 one is also in
docs/source/en/deepspeed.md). HF_WARMUP_DECAY is that guide's WarmupDecayLR scheduler entry.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
from harness.launch import run_deepspeed
from helpers.logged import train_losses, train_lrs
from helpers.machine import here
from helpers.messages import assert_names
from support.launch import tiny_run_args

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.schema import PRESETS, load_ds_config, preset_path
from gpt_ds.dsconfig.settings import ADAMW_DEFAULTS, RunSettings
from gpt_ds.launch.machine import detect_precision
from gpt_ds.model.gpt2 import resolve_shape

DATA = Path(__file__).parent / "data"
HF_CONFIGS = {"zero2": DATA / "hf_ds_config_zero2.json", "zero3": DATA / "hf_ds_config_zero3.json"}
HF_WARMUP_DECAY = {
    "type": "WarmupDecayLR",
    "params": {
        "last_batch_iteration": -1,
        "total_num_steps": "auto",
        "warmup_min_lr": "auto",
        "warmup_max_lr": "auto",
        "warmup_num_steps": "auto",
    },
}
TINY_WIDTH = resolve_shape("gpt2-tiny").n_embd

# (gpt_ds's run, the same run as the HF Trainer's arguments), values written out on both sides
RUNS = {
    "flags": (
        dict(micro_batch_size=2, grad_accum=3, lr=1e-3, warmup_iters=7, decay_iters=50,
             grad_clip=0.5, hidden_size=TINY_WIDTH),
        dict(per_device_train_batch_size=2, gradient_accumulation_steps=3, learning_rate=1e-3,
             warmup_steps=7, max_steps=50, max_grad_norm=0.5, hidden=TINY_WIDTH),
    ),
    "defaults": (  # gpt_ds's defaults: micro 4, accumulation 1, lr 6e-4, warmup 100, clip 1
        dict(decay_iters=2000, hidden_size=768),
        dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, learning_rate=6e-4,
             warmup_steps=100, max_steps=2000, max_grad_norm=1.0, hidden=768),
    ),
}  # fmt: skip


def hf_config(name: str, scheduler: dict | None = None) -> dict:
    raw = load_ds_config(HF_CONFIGS[name])
    if scheduler is not None:
        raw["scheduler"] = copy.deepcopy(scheduler)
    return raw


def auto_paths(node, path=()) -> list[tuple]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in auto_paths(v, (*path, k))]
    return [path] if node == "auto" else []


def at(cfg: dict, path: tuple):
    for key in path:
        cfg = cfg[key]
    return cfg


def hf_fills(raw: dict, hf_args: dict) -> dict:
    """What transformers' Trainer integration makes of `raw` for a one-process fp32 run."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments
    from transformers.integrations.deepspeed import (
        HfTrainerDeepSpeedConfig,
        unset_hf_deepspeed_config,
    )

    hf_args = dict(hf_args)
    hidden = hf_args.pop("hidden")
    args = TrainingArguments(
        output_dir="unused", report_to=[], adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8,
        weight_decay=0.1, **hf_args,
    )  # fmt: skip
    model = GPT2LMHeadModel(GPT2Config(n_embd=hidden, n_layer=1, n_head=2, n_positions=8))
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(raw))
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, args.max_steps)
        return hf.config
    finally:
        unset_hf_deepspeed_config()


# ---------------------------------------------------------------------------------------------
# Every "auto" filled as the HF Trainer fills it


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize(
    "name, scheduler", [("zero2", None), ("zero3", None), ("zero3", HF_WARMUP_DECAY)]
)
def test_autos_filled_as_hf_trainer_fills_them(name, scheduler, run):
    raw = hf_config(name, scheduler)
    ours, theirs = RUNS[run]
    resolved = resolve_ds_config(
        raw, RunSettings(world_size=1, precision="fp32", **ours), facts=here()
    )
    reference = hf_fills(raw, theirs)

    paths = auto_paths(raw)
    assert len(paths) >= 12  # batch 3, clipping, fp16, optimizer 4, scheduler 3-4, ZeRO 0-3
    assert auto_paths(resolved.config) == [] and auto_paths(reference) == []
    for path in paths:
        mine, hf = at(resolved.config, path), at(reference, path)
        assert mine == pytest.approx(hf), ".".join(path)


def test_zero_sizes_follow_the_model_width():
    raw = hf_config("zero3")
    r = resolve_ds_config(
        raw, RunSettings(world_size=2, decay_iters=20, hidden_size=96), facts=here()
    )
    zero = r.config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 96 * 96
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 96 * 96)
    assert zero["stage3_param_persistence_threshold"] == 960
    note = next(n for n in r.notes if n.startswith("ZeRO sizes"))
    assert "reduce_bucket_size 9,216 (h*h)" in note and "width 96" in note


def test_zero_sizes_without_a_model_take_the_presets():
    """A tool resolving a config with no model: the presets' sizes, and the log says so."""
    r = resolve_ds_config(
        hf_config("zero3"), RunSettings(world_size=1, decay_iters=20), facts=here()
    )
    zero, preset = r.config["zero_optimization"], load_ds_config(preset_path("zero3"))
    sizes = ("reduce_bucket_size", "stage3_prefetch_bucket_size")
    for key in (*sizes, "stage3_param_persistence_threshold"):
        assert zero[key] == preset["zero_optimization"][key]
    assert any("width is unknown here: the presets' sizes" in n for n in r.notes)


@pytest.mark.parametrize("name", PRESETS)
def test_adamw_autos_are_the_presets_recipe(name):
    params = load_ds_config(preset_path(name))["optimizer"]["params"]
    assert {k: params[k] for k in ADAMW_DEFAULTS} == ADAMW_DEFAULTS


def test_every_filled_value_is_noted():
    r = resolve_ds_config(
        hf_config("zero3"), RunSettings(world_size=1, decay_iters=20, lr=1e-3), facts=here()
    )
    log = "\n".join(r.notes)
    assert 'optimizer: AdamW betas [0.9, 0.95], eps 1e-08, weight_decay 0.1 (were "auto"' in log
    assert "lr: WarmupLR, log warmup from 0 to 0.001 (--lr) over 2 warmup steps" in log
    assert "then constant" in log
    assert "the presets' sizes" in log


@pytest.mark.parametrize("kind", ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"])
def test_schedule_keys_left_out_are_the_runs_not_deepspeeds_defaults(kind):
    """WarmupLR with no warmup_max_lr would run at DeepSpeed's 0.001 over its 1000 warmup
    steps while the log says --lr over --warmup_iters: left-out keys are filled as "auto"."""
    raw = hf_config("zero2", {"type": kind, "params": {}})
    run = RunSettings(world_size=1, decay_iters=20, lr=3e-4, warmup_iters=5)
    params = resolve_ds_config(raw, run, facts=here()).config["scheduler"]["params"]
    assert params["warmup_num_steps"] == 5
    if kind == "WarmupCosineLR":  # its peak is the optimizer's lr; the floor lr/10
        assert (params["total_num_steps"], params["cos_min_ratio"]) == (20, pytest.approx(0.1))
    else:
        assert (params["warmup_max_lr"], params["warmup_min_lr"]) == (3e-4, 0.0)
    if kind == "WarmupDecayLR":
        assert params["total_num_steps"] == 20
    if kind == "WarmupLR":
        assert "total_num_steps" not in params  # not a WarmupLR argument


def test_precision_auto_is_what_this_machine_can_do():
    """fp16.enabled "auto" and no bf16 section: gpt_ds detects, where HF would read --fp16."""
    r = resolve_ds_config(
        hf_config("zero2"), RunSettings(world_size=1, decay_iters=20), facts=here()
    )
    detected, _ = detect_precision()
    assert r.precision == detected
    assert r.config["fp16"]["enabled"] is (detected == "fp16")
    assert r.config["bf16"]["enabled"] is (detected == "bf16")


def test_filled_configs_parse_in_deepspeed():
    from deepspeed.runtime.config import DeepSpeedConfig

    for name in HF_CONFIGS:
        run = RunSettings(world_size=1, decay_iters=20, precision="fp32", hidden_size=64)
        parsed = DeepSpeedConfig(resolve_ds_config(hf_config(name), run, facts=here()).config)
        assert parsed.zero_config.reduce_bucket_size == (64 * 64 if name == "zero3" else 2e8)
        assert parsed.scheduler_name == "WarmupLR"
        assert parsed.scheduler_params["warmup_max_lr"] == pytest.approx(6e-4)


# ---------------------------------------------------------------------------------------------
# What contradicts the config is named


def problems(raw: dict, **run) -> str:
    with pytest.raises(ConfigError) as e:
        resolve_ds_config(
            raw, RunSettings(world_size=1, decay_iters=20, **run), source="hf.json", facts=here()
        )
    return "\n".join(e.value.problems)


def test_min_lr_with_constant_warmup_lr_is_an_error():
    msg = problems(hf_config("zero2"), min_lr=1e-5)
    assert_names(msg, "--min_lr 1e-05", "WarmupLR", "hf.json")  # the flag, the scheduler, the file


def test_warmup_decay_floor_from_min_lr_or_zero():
    raw = hf_config("zero2", HF_WARMUP_DECAY)
    run = RunSettings(world_size=1, decay_iters=20, lr=1e-3, min_lr=1e-4)
    r = resolve_ds_config(raw, run, facts=here())
    assert r.config["scheduler"]["params"]["warmup_min_lr"] == 1e-4 and r.min_lr == 1e-4
    assert any("then linear down to 0.0001 (--min_lr) at step 20" in n for n in r.notes)
    raw["scheduler"]["params"]["warmup_min_lr"] = 2e-4
    msg = problems(raw, lr=1e-3, min_lr=1e-4)  # the field and the flag that disagree, each value
    assert_names(msg, "scheduler.params.warmup_min_lr", "0.0002", "hf.json", "--min_lr", "0.0001")


def test_optimizer_lr_and_warmup_max_lr_must_agree():
    raw = hf_config("zero2")
    raw["optimizer"]["params"]["lr"] = 1e-3
    raw["scheduler"]["params"]["warmup_max_lr"] = 2e-3
    msg = problems(raw)
    assert_names(msg, "optimizer.params.lr", "0.001", "scheduler.params.warmup_max_lr", "0.002")


def test_auto_only_where_filled():
    raw = hf_config("zero2")
    raw["zero_optimization"]["allgather_bucket_size"] = "auto"
    msg = problems(raw)
    assert "zero_optimization.allgather_bucket_size: 'auto' is not of type 'integer'" in msg
    raw = hf_config("zero2")
    raw["scheduler"] = {"type": "StepLR", "params": {"step_size": "auto"}}
    msg = problems(raw)
    assert_names(msg, "scheduler.params.step_size", "StepLR")


# ---------------------------------------------------------------------------------------------
# They train


@pytest.mark.slow
@pytest.mark.parametrize("name", HF_CONFIGS)
def test_hf_config_trains(name, shakespeare_dir, tmp_path):
    """2 iterations of gpt2-tiny on 2 ranks with the HF example config, precision "auto"."""
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir, out, deepspeed_config=str(HF_CONFIGS[name]), max_iters=2,
        lr_decay_iters=8, warmup_iters=4, eval_interval=0, eval_iters=1, precision=None,
        no_checkpoint=True,
    )  # fmt: skip
    log = run_deepspeed(args, num_gpus=2).stdout
    detected, _ = detect_precision()
    assert f"precision: {detected} (" in log
    assert "lr: WarmupLR, log warmup from 0 to 0.002 (--lr) over 4 warmup steps" in log
    if name == "zero3":
        width = TINY_WIDTH
        assert f"reduce_bucket_size {width * width:,} (h*h)" in log
    losses = train_losses(out)
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    # DeepSpeed's WarmupLR, log warmup over 4 steps from 0 to 2e-3: built at batch iteration -1
    # (lr 0), one scheduler step per optimizer step; after iteration `it` the lr is
    # 2e-3 * ln(it) / ln(4): 0, then 1e-3 (the filled values reached the engine)
    lrs = train_lrs(out)
    assert lrs == pytest.approx({1: 0.0, 2: 2e-3 * math.log(2) / math.log(4)}, rel=1e-6)
