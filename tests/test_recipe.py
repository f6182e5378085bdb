"""The GPT-2 XL fine-tuning recipe (recipes/gpt2_xl_finetune_4x12gb.yaml, docs/memory.md) scaled
down: the preset picker prints the command for a small pretrained GPT-2 on 2 ranks, and that
command, unchanged but for the data and output flags, trains."""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from harness.launch import run_deepspeed, run_python
from support.launch import REPO

from gpt_ds.observe.metrics_file import read_metrics


@pytest.mark.slow
def test_the_pickers_fine_tuning_command_trains(shakespeare_dir, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    pretrained = tmp_path / "pretrained"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64)).save_pretrained(
        pretrained
    )
    pick = run_python(
        [str(REPO / "tools" / "pick_preset.py"), "--init_from", str(pretrained), "--lr", "3e-5"]
        + ["--gpus_per_node", "2", "--gpu_memory_gb", "2", "--global_batch_size", "8"]
        + ["--precision", "fp32", "--json"]
    )
    command = shlex.split(json.loads(pick.stdout)["recommendation"]["command"])
    assert command[:4] == ["deepspeed", "--num_gpus", "2", "gpt_ds/train.py"], command
    assert "--init_from" in command and "--model" not in command and "3e-05" in command
    out = tmp_path / "run"
    args = command[4:] + ["--data_dir", str(shakespeare_dir), "--out_dir", str(out)]
    args += ["--max_iters", "2", "--eval_interval", "0", "--eval_iters", "2", "--no_checkpoint"]
    proc = run_deepspeed(args, num_gpus=2)
    assert "2 layers, 2 heads, 64 wide, block 64" in proc.stdout
    assert "peak 3e-05 (--lr)" in proc.stdout
    train = [r for r in read_metrics(out) if r["kind"] == "train"]
    assert train[-1]["iter"] == 2 and train[-1]["loss"] > 0
    assert all(r["lr"] <= 3e-5 for r in train)
