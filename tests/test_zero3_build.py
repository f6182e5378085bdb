"""Under ZeRO-3 the model is built partitioned (gpt_ds/model/zero3.py): no rank holds it whole,
and its initial weights are those of a one-process build with the same seed."""

from __future__ import annotations

import pytest
import torch
from harness.launch import run_deepspeed
from support.launch import tiny_run_args

from gpt_ds.model.gpt2 import padded_vocab, resolve_shape
from gpt_ds.model.training_model import build_model


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage,device",
    [
        (2, "cpu"),
        (3, "cpu"),
        pytest.param(2, "cuda", marks=pytest.mark.gpu),
        pytest.param(3, "cuda", marks=pytest.mark.gpu),
    ],
)
def test_initial_weights_equal_a_one_process_build(stage, device, shakespeare_dir, tmp_path):
    """One step at lr 1e-30 keeps the initial weights (a change below fp32's resolution, but
    for zero biases, which move by ~1e-30): the `final` checkpoint holds them. On a GPU the
    partitioned build draws from the CUDA RNG (2 CPU ranks / 1 GPU rank), so the one-process
    reference is built on that device too."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir,
        out,
        deepspeed_config=f"ds_configs/zero{stage}.json",
        max_iters=1,
        eval_interval=0,
        eval_iters=1,
        lr=1e-30,
        warmup_iters=0,
        compile="off",  # the weights are the point: on a GPU, no minute of compiling
    )
    run_deepspeed(args, num_gpus=2 if device == "cpu" else 1)
    saved = get_fp32_state_dict_from_zero_checkpoint(str(out), tag="final")
    torch.manual_seed(1337)  # tiny_run_args' seed (seeds the CUDA generator too)
    # ZeRO-1/2 models are built on the CPU and then moved; ZeRO-3 builds on the device
    with torch.device(device if stage == 3 else "cpu"):
        reference = build_model(padded_vocab(resolve_shape("gpt2-tiny", block_size=64), 64))
    expected = {name: t.cpu() for name, t in reference.state_dict().items()}
    assert set(saved) <= set(expected) and len(saved) >= 4 * 12, sorted(saved)
    for name, tensor in saved.items():
        torch.testing.assert_close(
            tensor, expected[name], rtol=0, atol=1e-20, msg=lambda m, name=name: f"{name}: {m}"
        )
    # GPT-2's init: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer)
    assert saved["transformer.wte.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    c_proj = saved["transformer.h.0.mlp.c_proj.weight"].std().item()
    assert c_proj == pytest.approx(0.02 / 8**0.5, rel=0.05)
