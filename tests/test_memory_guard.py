"""The memory guard: a run whose own estimate cannot fit is refused before any model exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.launch import train_fails
from helpers.messages import assert_names, names
from support.launch import tiny_run_args

from gpt_ds.base.errors import ConfigError
from gpt_ds.launch.machine import cgroup_memory_limit, node_ram, node_ram_bytes
from gpt_ds.memory.estimate import CPU_BYTES_PER_RANK, DeepSpeedRun, GiB, estimate_run
from gpt_ds.memory.guard import (
    CPU_ONLY_RANK_BYTES,
    check_fits,
    ram_limit,
    usable_cpu_memory,
    usable_gpu_memory,
)
from gpt_ds.memory.picker import Hardware
from gpt_ds.model.gpt2 import resolve_shape


def estimate(micro_batch_size: int, world_size: int = 2):
    """gpt2-tiny as the trainer runs it by default (chunked loss)."""
    run = DeepSpeedRun(
        zero_stage=2,
        offload_optimizer=False,
        offload_param=False,
        world_size=world_size,
        gpus_per_node=world_size,
        micro_batch_size=micro_batch_size,
        precision="fp32",
        activation_checkpointing=False,
        loss="chunked",
    )
    return estimate_run(resolve_shape("gpt2-tiny", block_size=64), run)


def test_fits_on_gpu_and_cpu_when_there_is_room():
    est = estimate(4)
    check_fits(est, ranks_per_node=2, device_bytes=80 * GiB, ram=ram_limit(64 * GiB, None))
    check_fits(est, ranks_per_node=2, device_bytes=None, ram=ram_limit(64 * GiB, None))


def test_gpu_too_small_names_the_estimate_and_the_fixes():
    est = estimate(4)
    small = est.total - 1
    with pytest.raises(ConfigError) as e:
        check_fits(est, ranks_per_node=2, device_bytes=small, ram=ram_limit(64 * GiB, None))
    text = str(e.value)
    # the estimate, what a run may use of the card, the card, and the fixes
    figures = [f"{b / GiB:.2f} GiB" for b in (est.total, usable_gpu_memory(small), small)]
    assert_names(text, "GPU", *figures, "--micro_batch_size", "--ignore_memory_estimate")
    assert text.count(figures[0]) == 2  # the estimate and the card: equal to two decimals


def test_the_guard_uses_the_pickers_usable_gpu_memory():
    """On an 80 GiB H100 the picker plans with (80 - 1) x 0.9 = 71.1 GiB: a run estimated
    between that and 80 GiB would die of CUDA OOM at its first step, so it is refused."""
    assert usable_gpu_memory(80 * GiB) == Hardware(8, 1, 80.0).usable_gpu_bytes
    assert usable_gpu_memory(80 * GiB) / GiB == pytest.approx(71.1)
    est = estimate(4)
    card = int((est.total - 1) / 0.9) + GiB  # its usable part is just below the estimate
    assert usable_gpu_memory(card) < est.total < card
    with pytest.raises(ConfigError) as e:
        check_fits(est, ranks_per_node=2, device_bytes=card, ram=ram_limit(64 * GiB, None))
    # what a run may use of this card (the picker's figure), the card, the share
    assert_names(str(e.value), f"{usable_gpu_memory(card) / GiB:.2f} GiB", f"{card / GiB:.2f} GiB")
    assert_names(str(e.value), "90%")
    roomy = int(est.total / 0.9) + GiB + 16
    assert usable_gpu_memory(roomy) >= est.total
    check_fits(est, ranks_per_node=2, device_bytes=roomy, ram=ram_limit(64 * GiB, None))


def test_on_cpu_every_rank_counts_against_the_host():
    """Both ranks' model states and activations, each a CPU-only process (not a GPU rank's)."""
    est = estimate(4)
    need = est.cpu_bytes - 2 * (CPU_BYTES_PER_RANK - CPU_ONLY_RANK_BYTES) + 2 * est.total
    enough = int(need / 0.9) + 16  # the host check allows 90% of the RAM, as the picker
    assert usable_cpu_memory(enough) >= need
    check_fits(est, ranks_per_node=2, device_bytes=None, ram=ram_limit(enough, None))
    with pytest.raises(ConfigError) as e:
        check_fits(est, ranks_per_node=2, device_bytes=None, ram=ram_limit(need + 16, None))
    # both ranks on CPU, the node's estimate, 90% of the machine's RAM
    need_gib, ram_gib = f"{need / GiB:.2f} GiB", f"{(need + 16) / GiB:.2f} GiB"
    assert_names(str(e.value), "CPU", need_gib, "90%", ram_gib, "RAM")
    assert str(e.value).count(need_gib) == 2  # the estimate and the RAM: equal to two decimals


def test_an_impossible_run_is_refused_before_the_process_group(shakespeare_dir, tmp_path):
    """micro-batch 16384 x block 64 in one process: ~60 GiB of activations on a machine of
    far less (the chunked loss keeps the logits small, the layers' activations are not)."""
    est = estimate(16384, world_size=1)
    assert est.total > node_ram_bytes()  # the premise, on this machine
    args = tiny_run_args(shakespeare_dir, tmp_path / "out", micro_batch_size=16384)
    err = train_fails(args)  # refused before the process group and the model
    # the check that refused it, the ranks on CPU, and the fixes
    assert_names(err, "memory estimate", "CPU", "--micro_batch_size")
    assert_names(err, "--ignore_memory_estimate")


# --- the host's RAM: the machine's, or its cgroup's limit ------------------------------------


def cgroup_file(root: Path, rel: str, name: str, value: str) -> None:
    d = root / rel.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(value + "\n")


def test_cgroup_v2_limit_of_this_cgroup_or_a_parent(tmp_path):
    """Slurm puts a job's limit on the job's cgroup and runs the step in a child of it."""
    proc = "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n"
    job = "/system.slice/slurmstepd.scope/job_7"
    cgroup_file(tmp_path, job + "/step_0/user/task_0", "memory.max", "max")
    cgroup_file(tmp_path, job, "memory.max", str(16 * GiB))
    cgroup_file(tmp_path, "/system.slice", "memory.max", str(64 * GiB))
    assert cgroup_memory_limit(proc, tmp_path) == 16 * GiB
    cgroup_file(tmp_path, job + "/step_0", "memory.max", str(8 * GiB))
    assert cgroup_memory_limit(proc, tmp_path) == 8 * GiB  # the tightest on the way up


def test_cgroup_max_and_missing_files_mean_no_limit(tmp_path):
    cgroup_file(tmp_path, "/user.slice/session-1.scope", "memory.max", "max")
    assert cgroup_memory_limit("0::/user.slice/session-1.scope\n", tmp_path) is None
    assert cgroup_memory_limit("0::/not/mounted/here\n", tmp_path) is None
    assert cgroup_memory_limit("", tmp_path) is None


def test_cgroup_v2_in_a_container_namespace(tmp_path):
    """docker -m 16g with its own cgroup namespace: `0::/`, the limit at the mount's root."""
    cgroup_file(tmp_path, "/", "memory.max", str(16 * GiB))
    assert cgroup_memory_limit("0::/\n", tmp_path) == 16 * GiB
    # a path the mount does not show (the host's view of it): walked up to the mount's root
    assert cgroup_memory_limit("0::/docker/0123abcd\n", tmp_path) == 16 * GiB


def test_cgroup_v1_memory_controller_and_its_no_limit_value(tmp_path):
    proc = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n"
    cgroup_file(tmp_path, "memory/docker/abc", "memory.limit_in_bytes", str(12 * GiB))
    cgroup_file(tmp_path, "memory", "memory.limit_in_bytes", "9223372036854771712")
    assert cgroup_memory_limit(proc, tmp_path) == 12 * GiB
    cgroup_file(tmp_path, "memory/docker/abc", "memory.limit_in_bytes", "9223372036854771712")
    assert cgroup_memory_limit(proc, tmp_path) is None
    # a hybrid host: v2 mounted at unified/ next to v1's memory controller
    hybrid = proc + "0::/docker/abc\n"
    cgroup_file(tmp_path, "unified/docker/abc", "memory.max", str(6 * GiB))
    assert cgroup_memory_limit(hybrid, tmp_path) == 6 * GiB


def test_the_cgroup_limit_is_the_hosts_ram_and_is_named():
    machine = ram_limit(64 * GiB, None)
    assert machine.bytes == 64 * GiB
    assert_names(machine.limit, "64.00 GiB", "RAM")
    assert not names(machine.limit, "cgroup")
    assert ram_limit(64 * GiB, 128 * GiB).bytes == 64 * GiB
    limited = ram_limit(64 * GiB, 16 * GiB)
    assert limited.bytes == 16 * GiB
    assert_names(limited.limit, "cgroup", "16.00 GiB", "--mem", "docker -m")  # and who sets it
    est = estimate(4)
    need = est.cpu_bytes - 2 * (CPU_BYTES_PER_RANK - CPU_ONLY_RANK_BYTES) + 2 * est.total
    job = ram_limit(64 * GiB, need)  # a job's limit: the estimate itself, not 90% of it
    with pytest.raises(ConfigError) as e:
        check_fits(
            est,
            ranks_per_node=2,
            device_bytes=None,
            ram=job,
        )
    # 90% of the job's limit (the estimate itself), named as the cgroup's
    assert_names(str(e.value), "90%", "cgroup", f"{need / GiB:.2f} GiB", "--mem")
    here = node_ram()
    assert here.bytes == node_ram_bytes() > 0 and here.limit
