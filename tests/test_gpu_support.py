"""The GPU support check: every branch over facts as a GPU node would report them (pure
functions, no GPU needed), the live facts of this machine, and preflight's devices cell."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from harness.launch import run_python
from helpers.messages import assert_names
from support.launch import TRAIN, launch_env, tiny_run_args

from gpt_ds.launch.checks import Check, gpu_check
from gpt_ds.launch.gpu_support import (
    SKIP_ENV,
    Device,
    GpuFacts,
    builds_for,
    check_gpu_support,
    gather_facts,
    gpu_problems,
    min_driver,
    parse_driver_version,
    parse_probe_facts,
    parse_smi,
    probe_source,
    release_archs,
    runs_on,
)

# torch 2.13's published CUDA builds for x86_64 (torch.cuda.PYTORCH_RELEASES_CODE_CC)
RELEASES = {
    "12.6": (50, 60, 70, 75, 80, 86, 90),
    "12.9": (75, 80, 86, 90, 100, 120),
    "13.0": (75, 80, 86, 90, 100, 120),
}
CU130_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
V100 = Device("Tesla V100-SXM2-32GB", "sm_70")
H100 = Device("NVIDIA H100 80GB HBM3", "sm_90")
CU126_PIP = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"


def cuda_node(**overrides) -> GpuFacts:
    """A healthy node: PyPI's +cu130 torch, a 580 driver, an H100 that DeepSpeed uses."""
    facts = {
        "torch_version": "2.13.0+cu130",
        "cuda": "13.0",
        "arch_list": CU130_ARCHS,
        "cuda_available": True,
        "devices": (H100,),
        "nvidia_present": True,
        "driver": "580.65.06",
        "ds_accelerator": "cuda",
        "releases": RELEASES,
    }
    return GpuFacts(**{**facts, **overrides})


def test_a_healthy_gpu_node_and_a_cpu_machine_have_no_problem():
    assert gpu_problems(cuda_node()) == []
    cpu = GpuFacts(torch_version="2.13.0+cpu", ds_accelerator="cpu", releases=RELEASES)
    assert gpu_problems(cpu) == []


def test_v100_on_the_cu130_wheel_is_refused_naming_the_cu126_build():
    (problem,) = gpu_problems(cuda_node(devices=(V100,)))
    # the card's arch, the card, the arches this wheel carries, the build to install
    assert_names(problem, "sm_70", "GPU 0", "Tesla V100-SXM2-32GB", "sm_75", "sm_80", CU126_PIP)


def test_cubins_run_on_later_minors_of_their_major_and_ptx_on_anything_newer():
    assert runs_on("sm_80", 86) and runs_on("sm_90a", 90) and not runs_on("sm_86", 80)
    assert not runs_on("sm_80", 90) and runs_on("compute_80", 90) and not runs_on("compute_90", 80)
    assert gpu_problems(cuda_node(devices=(Device("RTX 4090", "sm_89"),))) == []  # sm_86 cubins


def test_a_driver_too_old_for_cuda_13_is_refused_and_says_cpu_would_be_used():
    """Driver 550 with the cu130 wheel: torch sees no GPU (nvidia-smi names the card)."""
    facts = cuda_node(driver="550.54.15", cuda_available=False, arch_list=(), ds_accelerator="cpu")
    driver, fallback = gpu_problems(facts)
    # the wheel's CUDA, the driver it needs, this driver, the build that runs on it
    assert_names(driver, "2.13.0+cu130", "CUDA 13.0", ">= 580", "550.54.15", "cu129")
    assert_names(fallback, "torch.cuda.is_available()", "CPU", "DS_ACCELERATOR=cpu")
    # a V100 there: only the cu126 build has its kernels (and runs on 550)
    v100 = gpu_problems(dataclasses.replace(facts, devices=(V100,)))
    assert_names(v100[0], "550.54.15", CU126_PIP)


def test_driver_minimums_are_nvidias_table():
    assert min_driver("13.0") == (580,) and min_driver("12.6") == (525, 60, 13)
    assert min_driver("10.2") is None
    assert gpu_problems(cuda_node(cuda="12.6", driver="525.60.13")) == []
    assert len(gpu_problems(cuda_node(cuda="12.6", driver="520.61.05"))) == 1
    assert builds_for(cuda_node(driver="470.82.01"), [90]) == []  # nothing runs: say where to look


def test_an_nvidia_gpu_torch_cannot_see_means_deepspeed_would_train_on_cpu():
    facts = cuda_node(cuda_available=False, arch_list=(), devices=(), ds_accelerator="cpu")
    (problem,) = gpu_problems(facts)  # driver fine: something else hides the GPU
    # what torch answers, where DeepSpeed would train, what to check, the on-purpose override
    assert_names(problem, "NVIDIA", "torch.cuda.is_available()", "False", "CPU")
    assert_names(problem, "nvidia-smi", "CUDA_VISIBLE_DEVICES", "DS_ACCELERATOR=cpu")


def test_a_cpu_torch_on_a_gpu_machine_is_told_which_build_to_install():
    facts = GpuFacts(
        torch_version="2.13.0+cpu",
        nvidia_present=True,
        driver="550.54.15",
        devices=(V100,),
        ds_accelerator="cpu",
        releases=RELEASES,
    )
    (problem,) = gpu_problems(facts)
    assert_names(problem, "2.13.0+cpu", CU126_PIP)  # this torch, the build to install


def test_ds_accelerator_cpu_set_by_the_user_is_cpu_ranks_on_purpose():
    facts = cuda_node(cuda_available=False, arch_list=(), ds_accelerator="cpu")
    assert gpu_problems(dataclasses.replace(facts, ds_accelerator_env="cpu")) == []


def test_deepspeed_disagreeing_with_torch_is_refused():
    (problem,) = gpu_problems(cuda_node(ds_accelerator="xpu", ds_accelerator_env="xpu"))
    assert_names(problem, "'xpu'", "DS_ACCELERATOR=xpu", "1 GPU(s)", "unset DS_ACCELERATOR")
    no_gpu = GpuFacts(torch_version="2.13.0+cpu", ds_accelerator="cuda", ds_accelerator_env="cuda")
    (problem,) = gpu_problems(no_gpu)
    assert_names(problem, "'cuda'", "DS_ACCELERATOR=cuda", "no GPU", "unset DS_ACCELERATOR")
    bad = GpuFacts(ds_accelerator_error="ValueError: bogus", ds_accelerator_env="bogus")
    (problem,) = gpu_problems(bad)
    assert_names(problem, "ValueError: bogus", "DS_ACCELERATOR")  # DeepSpeed's error, the fix


def test_a_rocm_arch_the_wheel_lacks_is_refused():
    rocm = GpuFacts(
        torch_version="2.13.0+rocm7.0",
        hip="7.0.51831",
        arch_list=("gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1100"),
        cuda_available=True,
        devices=(Device("AMD Instinct MI250X", "gfx90a:sramecc+:xnack-"),),
        ds_accelerator="cuda",
    )
    assert gpu_problems(rocm) == []
    navi = dataclasses.replace(rocm, devices=(Device("Radeon RX 5700", "gfx1010"),))
    (problem,) = gpu_problems(navi)
    # the wheel's ROCm, the card's arch, the card, the arches it carries, where to find a build
    assert_names(problem, "ROCm 7.0.51831", "gfx1010", "GPU 0", "Radeon RX 5700", "gfx90a")
    assert_names(problem, "https://pytorch.org/get-started/locally/")


def test_driver_and_cards_parsed_from_proc_and_nvidia_smi():
    proc = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 07:09:53 UTC 2025\nGCC version:  gcc 12.3.0\n"
    )
    assert parse_driver_version(proc) == "580.65.06"
    assert parse_driver_version("550.54.15\n") == "550.54.15"
    assert parse_driver_version("") is None
    smi = "550.54.15, Tesla V100-SXM2-32GB, 7.0\n550.54.15, Tesla V100-SXM2-32GB, 7.0\n"
    assert parse_smi(smi) == ("550.54.15", (V100, V100))
    assert parse_smi('Field "compute_cap" is not a valid field to query.\n') == (None, ())
    facts = GpuFacts.from_probe({"smi_text": smi, "dev_nvidia0": True, "cuda": "13.0"})
    assert facts.devices == (V100, V100) and facts.driver == "550.54.15" and facts.nvidia_present


def test_this_machine_gathers_facts_and_passes(monkeypatch):
    """The live part on this (CPU) machine: facts gathered, no problem, start-up not refused."""
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    facts = GpuFacts.from_probe(gather_facts())
    if facts.cuda_available or facts.nvidia_present:
        pytest.skip("a GPU machine: the pure tests cover its branches")
    assert facts.torch_version and facts.ds_accelerator == "cpu" and gpu_problems(facts) == []
    check_gpu_support(0)


def test_start_up_refuses_before_anything_is_built(shakespeare_dir, tmp_path):
    """The trainer, one process, told to use CUDA where torch sees none: refused in plan_run
    (DeepSpeed fixes its accelerator once per process, so this needs a process of its own)."""
    if GpuFacts.from_probe(gather_facts()).cuda_available:
        pytest.skip("torch sees a GPU here")
    env = dict(launch_env(), DS_ACCELERATOR="cuda")
    args = tiny_run_args(shakespeare_dir, tmp_path / "out")
    proc = run_python([str(TRAIN), *args], timeout=300, check=False, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    # the check that refused it, the accelerator asked for, and the override
    assert_names(proc.stderr, "GPU support", "'cuda'", "DS_ACCELERATOR=cuda", f"{SKIP_ENV}=1")
    assert not list((tmp_path / "out").glob("*/gpt_ds.json"))
    check_gpu_support(0, env={SKIP_ENV: "1"})  # the override: not even gathered


def test_torchs_release_table_reads_the_same_in_both_of_its_shapes():
    """torch 2.13 nests PYTORCH_RELEASES_CODE_CC per host; torch 2.11 (seen on an H200 node,
    2.11.0+cu130) maps each CUDA release straight to its set, and gathering facts there crashed
    on `.get`. The flat table made from this torch's nested one reads the same."""
    import torch

    nested = torch.cuda.PYTORCH_RELEASES_CODE_CC
    for host in ("x86_64", "aarch64"):
        flat = {cuda: set(per_host[host]) for cuda, per_host in nested.items()}
        assert release_archs(flat, host) == release_archs(nested, host)
        assert all(release_archs(nested, host).values())
    assert release_archs(nested, "x86_64") != release_archs(nested, "aarch64")


def test_probe_source_runs_alone_and_preflight_reads_its_line():
    """What preflight appends to its probe: standalone source, one marked line of facts."""
    out = subprocess.run(
        [sys.executable, "-"], input="print('banner')\n" + probe_source(), text=True,
        capture_output=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    facts = parse_probe_facts(out.stdout)
    assert facts is not None and facts.torch_version
    assert parse_probe_facts("no facts here\n") is None


def test_preflight_devices_cell_fails_with_the_fix():
    ok = Check(True, "1 cuda")
    assert gpu_check(ok, cuda_node()) is ok and gpu_check(ok, None) is ok
    cell = gpu_check(ok, cuda_node(devices=(V100,)))
    assert cell.ok is False and cell.text == "GPU unusable" and CU126_PIP in cell.fix
    hidden = cuda_node(cuda_available=False, arch_list=(), devices=(), ds_accelerator="cpu")
    assert gpu_check(Check(True, "0/cpu"), hidden).text == "GPU unseen"
    failed = Check(False, "2 < slots=4", "lower slots")
    assert gpu_check(failed, cuda_node(devices=(V100,))) is failed  # one failure at a time
