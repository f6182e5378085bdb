"""Precision decisions for hardware this machine has and has not: GPUs by their reported native
bf16 and compute capability (pure functions, no training pretended), and fp16 refused before
anything is built on CPU ranks (every CPU, with or without oneDNN's fp16: a real launch) and on
a compute capability 6.x GPU (the pure function).

Machine-independent: every CPU answer of DeepSpeed's accelerator is given to the pure functions
as an argument; the launch takes this machine's, and both answers are refused the same way."""

from __future__ import annotations

import pytest
from deepspeed.accelerator import get_accelerator
from harness.launch import run_deepspeed
from helpers.machine import here
from helpers.messages import assert_names, names
from support.launch import tiny_run_args

from gpt_ds.base.errors import ConfigError
from gpt_ds.dsconfig.resolve import resolve_ds_config
from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.dsconfig.settings import RunSettings
from gpt_ds.launch.machine import cuda_fp16_refusal, fp16_refusal, gpu_precision, precision_refusal

BF16_CPU = "processor: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n"
OLD_CPU = "flags : fpu sse avx2 avx512f\n"
FP16_CPU = "flags : fpu avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_fp16\n"  # Xeon 6
# this machine: does DeepSpeed's accelerator train fp16 here? (oneDNN's answer on a CPU:
# True on AVX512-FP16 / AMX-FP16 Xeons, False on AMD EPYC and older Xeons)
FP16_HERE = bool(get_accelerator().is_fp16_supported())


@pytest.mark.parametrize(
    "kind, name, native_bf16, capability, expected",
    [
        ("CUDA", "Tesla V100-SXM2-32GB", False, (7, 0), "fp16"),
        ("CUDA", "Tesla T4", False, (7, 5), "fp16"),
        ("CUDA", "Tesla P100-PCIE-16GB", False, (6, 0), "fp32"),
        ("CUDA", "NVIDIA GeForce GTX 1080 Ti", False, (6, 1), "fp32"),
        ("CUDA", "NVIDIA A100-SXM4-80GB", True, (8, 0), "bf16"),
        ("CUDA", "NVIDIA H100 80GB HBM3", True, (9, 0), "bf16"),
        ("ROCm", "AMD Instinct MI300X", True, (9, 4), "bf16"),
    ],
)
def test_gpu_precision(kind, name, native_bf16, capability, expected):
    precision, reason = gpu_precision(kind, name, native_bf16, capability)
    assert precision == expected
    assert reason.startswith(f"{kind} device {name} ")
    assert ("dynamic loss scaling" in reason) is (expected == "fp16")


def test_auto_on_compute_capability_6_says_why_fp32():
    _, reason = gpu_precision("CUDA", "Tesla P100-PCIE-16GB", False, (6, 0))
    # the device, its capability, what it lacks, and the capability fp16 needs
    assert_names(reason, "CUDA", "Tesla P100-PCIE-16GB", "6.0", "bf16", "fp16", "7.0")


@pytest.mark.parametrize("capability", [(6, 0), (6, 1), (5, 2)])
def test_fp16_on_compute_capability_below_7_is_refused_with_the_fix(capability):
    major, minor = capability
    refusal = cuda_fp16_refusal("CUDA", capability)
    # the capability needed and this GPU's, the flag that fixes it, DeepSpeed's override
    fixes = ("--precision fp32", "DS_ALLOW_DEPRECATED_FP16=1")
    assert_names(refusal, "fp16", "7.0", f"{major}.{minor}", *fixes)
    assert not names(refusal, "--precision bf16")  # no native bf16 on 6.x either
    # what precision_refusal passes on a CUDA machine: the accelerator's answer and capability
    assert fp16_refusal("cuda", False, None, capability) == refusal


def test_fp16_on_compute_capability_7_and_rocm_is_not_refused():
    assert cuda_fp16_refusal("CUDA", (7, 0)) is None and cuda_fp16_refusal("CUDA", (9, 0)) is None
    assert cuda_fp16_refusal("ROCm", (9, 4)) is None
    # DS_ALLOW_DEPRECATED_FP16=1 on 6.x: DeepSpeed's accelerator says yes, and so do we
    assert fp16_refusal("cuda", True, None, (6, 0)) is None


def test_fp16_refusal_on_a_cpu_says_what_to_use_instead():
    refusal = fp16_refusal("cpu", False, BF16_CPU, None)
    # what it needs, the fixes, and why bf16 is one (the CPU's feature)
    assert_names(refusal, "fp16", "GPU", "--precision bf16", "AMX-BF16", "--precision fp32")
    old = fp16_refusal("cpu", False, OLD_CPU, None)
    assert_names(old, "fp16", "GPU", "--precision fp32")
    assert not names(old, "--precision bf16")  # this CPU has no native bf16 either
    assert fp16_refusal("cuda", True, None, (8, 0)) is None


def test_fp16_is_refused_on_a_cpu_that_computes_it():
    """oneDNN's fp16 (DeepSpeed's CPU accelerator says yes): refused all the same, bf16 named."""
    refusal = fp16_refusal("cpu", True, FP16_CPU, None)
    assert_names(refusal, "fp16", "GPU", "--precision bf16", "AMX-BF16", "--precision fp32")
    # what this machine's accelerator answers makes no difference to whether fp16 is refused
    assert fp16_refusal("cpu", FP16_HERE, OLD_CPU, None) is not None


def test_only_fp16_is_checked():
    assert precision_refusal("bf16") is None and precision_refusal("fp32") is None
    assert precision_refusal("fp16") is not None  # CPU ranks, whatever the CPU


def settings(precision: str | None) -> RunSettings:
    return RunSettings(world_size=1, decay_iters=20, precision=precision)


def test_the_resolver_refuses_fp16_where_deepspeed_would():
    """--precision fp16, or fp16.enabled in the config: refused by this machine's answer."""
    pinned = load_ds_config(preset_path("zero2"))
    pinned["fp16"]["enabled"] = True
    cases = [
        (load_ds_config(preset_path("zero2")), "fp16", ["--precision fp16"]),
        (pinned, None, ["fp16.enabled", "x.json"]),  # the key and the file that set it
    ]
    for raw, forced, where in cases:
        with pytest.raises(ConfigError) as err:
            resolve_ds_config(raw, settings(forced), source="x.json", facts=here())
        (problem,) = err.value.problems
        assert_names(problem, *where)
        assert precision_refusal("fp16") in problem  # with this machine's reason and fixes


@pytest.mark.slow
def test_an_fp16_run_here_is_refused_before_the_model_is_built(shakespeare_dir, tmp_path):
    """A real 2-rank launch with --precision fp16 (a valid run otherwise: warm-up inside it):
    every rank stops in planning, exit 2, rank 0 says why once, and nothing was built or
    written (not even the out dir), on every CPU."""
    out = tmp_path / "run"
    args = tiny_run_args(
        shakespeare_dir, out, precision="fp16", max_iters=6, warmup_iters=2, eval_interval=0
    )
    proc = run_deepspeed(args, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = f"  - --precision fp16: {precision_refusal('fp16')}"
    assert proc.stderr.count(message) == 1, proc.stderr[-3000:]
    assert proc.stderr.count("error: invalid configuration") == 1, proc.stderr[-3000:]
    assert "Type fp16 is not supported" not in proc.stderr + proc.stdout  # DeepSpeed's own
    assert not out.exists()
