"""The memory guard: a run whose own estimate cannot fit is refused before any model exists."""

from __future__ import annotations

import pytest
from helpers.launch import tiny_run_args, train_fails

from gpt_ds.errors import ConfigError
from gpt_ds.memory import estimate_run
from gpt_ds.memory.constants import GiB
from gpt_ds.memory.estimate import CPU_BYTES_PER_RANK
from gpt_ds.memory.guard import CPU_ONLY_RANK_BYTES, check_fits, host_memory_bytes
from gpt_ds.model import resolve_shape


def estimate(micro_batch_size: int, world_size: int = 2):
    """gpt2-tiny as the trainer runs it by default (chunked loss)."""
    return estimate_run(
        resolve_shape("gpt2-tiny", block_size=64),
        zero_stage=2,
        offload_optimizer=False,
        offload_param=False,
        world_size=world_size,
        gpus_per_node=world_size,
        micro_batch_size=micro_batch_size,
        precision="fp32",
        activation_checkpointing=False,
        chunked_loss=True,
    )


def test_fits_on_gpu_and_cpu_when_there_is_room():
    est = estimate(4)
    check_fits(est, ranks_per_node=2, device_bytes=80 * GiB, host_bytes=64 * GiB)
    check_fits(est, ranks_per_node=2, device_bytes=None, host_bytes=64 * GiB)


def test_gpu_too_small_names_the_estimate_and_the_fixes():
    est = estimate(4)
    small = est.total - 1
    with pytest.raises(ConfigError) as e:
        check_fits(est, ranks_per_node=2, device_bytes=small, host_bytes=64 * GiB)
    text = str(e.value)
    assert f"the estimate is {est.total / GiB:.2f} GiB per GPU" in text
    assert f"the GPU has {small / GiB:.2f} GiB" in text
    assert "--micro_batch_size" in text and "--ignore_memory_estimate" in text


def test_on_cpu_every_rank_counts_against_the_host():
    """Both ranks' model states and activations, each a CPU-only process (not a GPU rank's)."""
    est = estimate(4)
    need = est.cpu_bytes - 2 * (CPU_BYTES_PER_RANK - CPU_ONLY_RANK_BYTES) + 2 * est.total
    check_fits(est, ranks_per_node=2, device_bytes=None, host_bytes=need)
    with pytest.raises(ConfigError, match=rf"is {need / GiB:.2f} GiB per node"):
        check_fits(est, ranks_per_node=2, device_bytes=None, host_bytes=need - 1)


def test_an_impossible_run_is_refused_before_the_process_group(shakespeare_dir, tmp_path):
    """micro-batch 16384 x block 64 in one process: ~60 GiB of activations on a machine of
    far less (the chunked loss keeps the logits small, the layers' activations are not)."""
    est = estimate(16384, world_size=1)
    assert est.total > host_memory_bytes()  # the premise, on this machine
    args = tiny_run_args(shakespeare_dir, tmp_path / "out", micro_batch_size=16384)
    err = train_fails(args)  # refused before the process group and the model
    assert "error: invalid configuration (memory estimate):" in err
    assert "rank(s) on CPU is" in err and "--ignore_memory_estimate" in err
