"""The GPU subset (`pytest -m gpu` on a GPU machine; skipped elsewhere): what a new user with
one GPU and a pip-installed torch runs first. One rank, the default preset and `--precision
auto` (bf16 on Ampere and newer, fp16 with loss scaling on V100/T4): it trains, says which
optimizer runs and why, makes no host sync between two log lines (torch's own check), resumes,
and exports weights equal to DeepSpeed's own converter's. One trained run is shared and only
it and its resume compile (the ZeRO-3 build tests run eager), so the subset takes minutes.
The fp16 chunked-loss gradients and the ZeRO-3 build's CUDA-RNG weights are GPU variants of
tests in test_chunked_loss.py and test_zero3_build.py.

None of these has run here (no GPU in CI); the CPU suite proves the same paths on CPU ranks."""

from __future__ import annotations

import shutil

import pytest
import torch
from harness.launch import run_deepspeed, run_python
from helpers.logged import train_losses
from support.launch import REPO, launch_env, tiny_run_args
from support.runs import consolidated_model

from gpt_ds.dsconfig.optimization import choose_adam
from gpt_ds.launch.machine import adam_facts
from gpt_ds.observe.profile import SYNC_DEBUG_ENV

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
K = 6  # iterations before the resume, logged at K and 2K; 2K in all
SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's, c10/cuda warn_or_error_on_sync


def gpu_args(data_dir, out, **overrides) -> list[str]:
    """tiny_run_args on the GPU's own precision (auto), dropout off, the schedule of the 2K
    iterations whatever --max_iters (so a run stopped at K is the first half of it), a log line
    (the steps' one host sync) every K iterations."""
    every_k = {"eval_interval": K, "log_interval": K}
    return tiny_run_args(
        data_dir,
        out,
        **{"precision": "auto", "max_iters": 2 * K, "lr_decay_iters": 2 * K, **every_k} | overrides,
    )


@pytest.fixture(scope="module")
def gpu_run(shakespeare_dir, tmp_path_factory):
    """(out_dir, stdout and stderr) of one uninterrupted 1-GPU run of 2K iterations, profiled
    (steps 3-5, between the log lines) under torch's sync check in its "warn" mode: a host sync
    there warns (SYNC_WARNING) and the run goes on, so one launch in a short GPU slot still
    gives every other test its run."""
    out = tmp_path_factory.mktemp("gpu") / "full"
    env = launch_env() | {SYNC_DEBUG_ENV: "warn"}
    args = gpu_args(shakespeare_dir, out, profile=True)
    proc = run_deepspeed(args, num_gpus=1, env=env)
    return out, proc.stdout + proc.stderr


def test_one_gpu_trains_with_the_defaults_and_says_which_optimizer(gpu_run):
    out, stdout = gpu_run
    assert "rank 0/1" in stdout
    losses = train_losses(out)
    assert sorted(losses) == [K, 2 * K]
    assert losses[2 * K] < losses[K]
    # the choice this machine makes (FusedAdam where nvcc or a prebuilt op allows, else
    # torch's fused AdamW), as the start-up report states it
    assert choose_adam(adam_facts(offload=False), {}).note in stdout


def test_the_steps_between_log_lines_make_no_host_sync(gpu_run):
    """gpu_run's profiled steps ran under torch.cuda.set_sync_debug_mode("warn") and torch
    warned of no synchronizing call: none of them waited for the device (a `.item()`, a
    blocking copy, a device synchronize such as DeepSpeed's after backward with overlap_comm
    on). A failure shows the warning, with where it came from."""
    out, said = gpu_run
    assert f"{SYNC_DEBUG_ENV}=warn: torch's sync check over steps 3-5" in said
    assert list((out / "profile").glob("rank0.steps3-5.json"))
    warned = [line for line in said.splitlines() if SYNC_WARNING in line]
    assert not warned, "\n".join(warned[:10])


def test_a_resumed_gpu_run_follows_the_uninterrupted_one(gpu_run, shakespeare_dir, tmp_path):
    """The uninterrupted run's checkpoint at K resumed (one launch, sharing the run): GPU
    kernels (atomics in the embedding backward) are not bit-reproducible, and bf16 (8 mantissa
    bits, ~4e-3 relative) rounds the last bits apart within a few steps; so the losses agree to
    5e-3, not bit for bit as on CPU ranks. (The same runs on CPU ranks are bit-identical.)"""
    full, _ = gpu_run
    split = tmp_path / "split"
    split.mkdir()
    shutil.copytree(full / f"iter_{K}", split / f"iter_{K}")  # what a K-step run leaves
    proc = run_deepspeed(gpu_args(shakespeare_dir, split, resume=True), num_gpus=1)
    assert f"resumed from {split}/iter_{K} at iteration {K}" in proc.stdout
    a, b = train_losses(full), train_losses(split)
    assert sorted(b) == [2 * K]
    assert b[2 * K] == pytest.approx(a[2 * K], rel=5e-3)


def test_the_export_of_a_gpu_run_equals_deepspeeds_converter(gpu_run, tmp_path):
    from transformers import GPT2LMHeadModel

    out, _ = gpu_run
    hf = tmp_path / "hf"
    run_python([str(REPO / "tools" / "zero_to_fp32.py"), str(out), "--output", str(hf)])
    exported = GPT2LMHeadModel.from_pretrained(hf).state_dict()
    reference = consolidated_model(out, "final").state_dict()
    for name, tensor in reference.items():
        assert torch.equal(exported[name], tensor), name
