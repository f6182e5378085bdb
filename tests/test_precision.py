"""Precision decisions for hardware this machine has and has not: GPUs by their reported native
bf16 (pure functions, no training pretended), and fp16 refused before anything is built where
DeepSpeed's accelerator cannot train it (this CPU: a real launch)."""

from __future__ import annotations

import pytest
from deepspeed.accelerator import get_accelerator
from helpers.launch import run_deepspeed, tiny_run_args

from gpt_ds.ds_config import RunSettings, resolve_ds_config
from gpt_ds.ds_schema import load_ds_config, preset_path
from gpt_ds.errors import ConfigError
from gpt_ds.metrics import read_metrics
from gpt_ds.precision import fp16_refusal, gpu_precision, precision_refusal

BF16_CPU = "processor: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n"
OLD_CPU = "flags : fpu sse avx2 avx512f\n"
# this machine: does DeepSpeed's accelerator train fp16 here? (oneDNN's answer on a CPU)
FP16_HERE = bool(get_accelerator().is_fp16_supported())


@pytest.mark.parametrize(
    "kind, name, native_bf16, expected",
    [
        ("CUDA", "Tesla V100-SXM2-32GB", False, "fp16"),
        ("CUDA", "Tesla T4", False, "fp16"),
        ("CUDA", "NVIDIA A100-SXM4-80GB", True, "bf16"),
        ("CUDA", "NVIDIA H100 80GB HBM3", True, "bf16"),
        ("ROCm", "AMD Instinct MI300X", True, "bf16"),
    ],
)
def test_gpu_precision(kind, name, native_bf16, expected):
    precision, reason = gpu_precision(kind, name, native_bf16)
    assert precision == expected
    assert reason.startswith(f"{kind} device {name} ")
    assert ("dynamic loss scaling" in reason) is (expected == "fp16")


def test_fp16_refusal_on_a_cpu_says_what_to_use_instead():
    assert fp16_refusal("cpu", False, BF16_CPU) == (
        "fp16 with dynamic loss scaling needs a GPU: DeepSpeed's CPU accelerator refuses fp16 "
        "on this machine (the CPU has no native fp16 arithmetic); use --precision bf16 (native "
        "here: CPU reports AMX-BF16) or --precision fp32"
    )
    assert fp16_refusal("cpu", False, OLD_CPU).endswith(
        "use --precision fp32 (this CPU has no native bf16 either)"
    )
    assert fp16_refusal("cpu", True, OLD_CPU) is None  # oneDNN computes fp16 (AVX512-FP16)
    assert fp16_refusal("cuda", True, None) is None


def test_only_fp16_is_checked():
    assert precision_refusal("bf16") is None and precision_refusal("fp32") is None
    assert (precision_refusal("fp16") is None) is FP16_HERE


def settings(precision: str | None) -> RunSettings:
    return RunSettings(world_size=1, max_iters=20, precision=precision)


def test_the_resolver_refuses_fp16_where_deepspeed_would():
    """--precision fp16, or fp16.enabled in the config: refused by this machine's answer."""
    pinned = load_ds_config(preset_path("zero2"))
    pinned["fp16"]["enabled"] = True
    cases = [
        (load_ds_config(preset_path("zero2")), "fp16", "--precision fp16"),
        (pinned, None, "fp16.enabled is true in x.json"),
    ]
    for raw, forced, why in cases:
        if FP16_HERE:
            assert resolve_ds_config(raw, settings(forced), source="x.json").precision == "fp16"
            continue
        with pytest.raises(ConfigError) as err:
            resolve_ds_config(raw, settings(forced), source="x.json")
        assert err.value.problems == [f"{why}: {precision_refusal('fp16')}"]


@pytest.mark.slow
def test_an_fp16_run_here_is_refused_before_the_model_is_built(shakespeare_dir, tmp_path):
    """A real 2-rank launch with --precision fp16. Where DeepSpeed's accelerator refuses fp16
    (this CPU) every rank stops in planning: exit 2, rank 0 says why once, and nothing was
    built or written (not even the out dir). Where it trains fp16, the loss scale is logged."""
    out = tmp_path / "run"
    args = tiny_run_args(shakespeare_dir, out, precision="fp16", max_iters=3, eval_interval=0)
    proc = run_deepspeed(args, check=False)
    if FP16_HERE:
        assert proc.returncode == 0, proc.stderr[-3000:]
        scales = [r["loss_scale"] for r in read_metrics(out) if r.get("kind") == "train"]
        assert len(scales) == 3 and all(s > 0 for s in scales), scales
        return
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = f"  - --precision fp16: {precision_refusal('fp16')}"
    assert proc.stderr.count(message) == 1, proc.stderr[-3000:]
    assert "Type fp16 is not supported" not in proc.stderr + proc.stdout  # DeepSpeed's own
    assert not out.exists()
