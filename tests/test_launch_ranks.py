"""The local launch's rank count and `deepspeed` runner flags (gpt_ds/launch/ranks.py): every
branch as a pure function, for GPU machines this one is not; then the script as the launchers
run it, on this machine (torch's real device count, 0 here)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.messages import assert_names
from support.launch import REPO, launch_env

from gpt_ds.launch.ranks import (
    CPU_RANKS,
    RankPlan,
    RankRefusal,
    parse_requested,
    plan_ranks,
    shell_lines,
)

SCRIPT = REPO / "gpt_ds" / "launch" / "ranks.py"


def test_no_gpu_gives_two_cpu_ranks_or_as_many_as_asked():
    assert plan_ranks(None, {}, 0) == RankPlan(
        CPU_RANKS, ("--num_gpus", "2"), (), "no GPU: 2 CPU ranks"
    )
    # CPU ranks are processes: more than 2 is allowed (the refusal is for GPUs)
    assert plan_ranks(3, {}, 0).flags == ("--num_gpus", "3")


def test_visible_devices_variables_stay_for_cpu_ranks():
    """CUDA_VISIBLE_DEVICES="" (GPUs hidden on purpose, as the test suite does) stays hidden."""
    plan = plan_ranks(None, {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}, 0)
    assert plan.flags == ("--num_gpus", "2") and plan.unset == ()


def test_one_gpu_gets_one_rank():
    """The issue's crash: `--num_gpus 2` on a 1-GPU machine started a rank on cuda:1."""
    plan = plan_ranks(None, {}, 1)
    assert plan.ranks == 1 and plan.flags == ("--num_gpus", "1") and plan.unset == ()


def test_fewer_ranks_than_gpus_without_a_variable():
    assert plan_ranks(2, {}, 8).flags == ("--num_gpus", "2")


@pytest.mark.parametrize(
    "visible, count, shown",
    [
        ({}, 1, []),
        ({"CUDA_VISIBLE_DEVICES": "3"}, 1, ["CUDA_VISIBLE_DEVICES=3"]),
        ({"HIP_VISIBLE_DEVICES": "0"}, 1, ["HIP_VISIBLE_DEVICES=0"]),
    ],
)
def test_more_ranks_than_gpus_is_refused_with_the_fix(visible, count, shown):
    """What was asked, how many GPUs are visible and through which variable, and the fix."""
    with pytest.raises(RankRefusal) as err:
        plan_ranks(2, visible, count)
    assert_names(str(err.value), "GPT_DS_NUM_GPUS=2", *shown, "GPT_DS_NUM_GPUS=1")


def test_cuda_visible_devices_is_honoured_as_include():
    """GPUs 2,3 chosen: DeepSpeed would train on 0,1 with --num_gpus; --include keeps 2,3."""
    plan = plan_ranks(None, {"CUDA_VISIBLE_DEVICES": "2,3"}, 2)
    assert plan == RankPlan(
        2,
        ("--include", "localhost:2,3"),
        ("CUDA_VISIBLE_DEVICES",),
        "2 ranks on GPUs 2,3 (CUDA_VISIBLE_DEVICES=2,3, as --include)",
    )
    assert "--num_gpus" not in plan.flags  # DeepSpeed refuses --num_gpus with --include
    assert plan_ranks(1, {"CUDA_VISIBLE_DEVICES": "2, 3"}, 2).flags == ("--include", "localhost:2")


def test_hip_visible_devices_stays_and_ranks_count_from_zero():
    plan = plan_ranks(None, {"HIP_VISIBLE_DEVICES": "2,3"}, 2)
    assert plan.flags == ("--num_gpus", "2") and plan.unset == ()
    assert "of HIP_VISIBLE_DEVICES=2,3" in plan.note


@pytest.mark.parametrize(
    "visible, count, needle",
    [
        ({"CUDA_VISIBLE_DEVICES": "GPU-5f1c,GPU-77aa"}, 2, "needs GPU indices"),
        ({"CUDA_VISIBLE_DEVICES": "MIG-1a2b"}, 1, "not UUIDs or MIG names"),
        ({"CUDA_VISIBLE_DEVICES": "0,1,7"}, 2, "names 3 GPU(s) but torch sees 2"),
        ({"CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"}, 1, "Unset one of them"),
    ],
)
def test_visible_devices_deepspeed_cannot_pass_on_are_refused(visible, count, needle):
    with pytest.raises(RankRefusal) as err:
        plan_ranks(None, visible, count)
    assert needle in str(err.value)


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5"])
def test_num_gpus_must_be_a_positive_integer(text):
    with pytest.raises(RankRefusal) as err:
        parse_requested(text)
    assert_names(str(err.value), "GPT_DS_NUM_GPUS", repr(text))  # the variable, its value


def test_unset_or_empty_num_gpus_means_default():
    assert parse_requested(None) is None and parse_requested("") is None
    assert parse_requested("3") == 3


def test_shell_lines_round_trip_through_bash():
    plan = RankPlan(2, ("--include", "localhost:2,3"), ("CUDA_VISIBLE_DEVICES",), "a 'note'")
    script = shell_lines(plan) + (
        'printf "%s|" "$GPT_DS_RANKS" "${GPT_DS_RUNNER_FLAGS[@]}" "${GPT_DS_UNSET[@]}" '
        '"$GPT_DS_RANK_NOTE"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout == "2|--include|localhost:2,3|CUDA_VISIBLE_DEVICES|a 'note'|"


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The script as env.sh runs it, with only the visible-devices variables given in `env`
    (conftest hides the GPUs of a GPU machine with empty ones: torch then sees 0 there too)."""
    base = launch_env()
    hidden = {name: "" for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES") if name in base}
    for name in hidden:
        base.pop(name)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env={**base, **(env or hidden)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_script_plans_this_machine_with_torch_device_count():
    """No GPU torch can see (none here; hidden by conftest on a GPU machine): 2 CPU ranks, 3
    when asked (CPU ranks are processes, not devices), no refusal, nothing unset."""
    proc = run_script()
    assert proc.returncode == 0, proc.stderr
    assert "GPT_DS_RANKS=2\nGPT_DS_RUNNER_FLAGS=(--num_gpus 2)\nGPT_DS_UNSET=()\n" in proc.stdout
    proc = run_script("3", CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stderr
    assert "GPT_DS_RANKS=3\nGPT_DS_RUNNER_FLAGS=(--num_gpus 3)\nGPT_DS_UNSET=()\n" in proc.stdout


def test_script_refusal_exits_2_with_the_message_only():
    proc = run_script("none")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: GPT_DS_NUM_GPUS must be a positive number of ranks, got 'none'\n"


def test_this_suite_trains_on_cpu_ranks_whatever_the_machine_has():
    """conftest hides GPUs from every run but `pytest -m gpu`: the suite's numbers and its 2-rank
    launches assume CPU ranks, and launched ranks inherit the environment."""
    import torch
    from deepspeed.accelerator import get_accelerator
    from support.launch import launch_env

    env = launch_env()
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["HIP_VISIBLE_DEVICES"] == ""
    assert env["DS_ACCELERATOR"] == "cpu"
    assert not torch.cuda.is_available() and get_accelerator().device_name() == "cpu"
