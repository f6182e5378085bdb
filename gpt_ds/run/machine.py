"""This machine's `MachineFacts` (dsconfig/settings.py), probed once at start: everything the
run's resolution needs to know about the hardware and the installed packages, asked here and
nowhere else."""

from __future__ import annotations

import importlib.util
import os
import shutil
from importlib import metadata

from gpt_ds.base import dist
from gpt_ds.dsconfig.monitors import MONITOR_PACKAGES
from gpt_ds.dsconfig.optimizer import adam_facts
from gpt_ds.dsconfig.precision import detect_precision, precision_refusal
from gpt_ds.dsconfig.settings import MachineFacts
from gpt_ds.launch.gpu_support import check_gpu_support
from gpt_ds.memory.guard import node_ram


def probe_machine(local_rank: int = 0) -> MachineFacts:
    """This machine's facts, asked once at start (before the process group exists: the world
    is the launcher's). A ConfigError first where this rank's GPU cannot be used or DeepSpeed
    would silently train on CPU (launch/gpu_support.py), before any other question to it."""
    import torch
    from deepspeed.accelerator import get_accelerator

    check_gpu_support(local_rank)  # first: a GPU unseen, or DS_ACCELERATOR set wrong
    ram = node_ram()

    device_type = get_accelerator().device_name()
    on_gpu = device_type == "cuda" and torch.cuda.is_available()
    return MachineFacts(
        device_type=device_type,
        world_size=dist.world_size(),  # the launcher's (or mpirun's, srun's: adopted)
        ranks_per_node=dist.local_world_size(),
        precision=detect_precision(),
        fp16_refusal=precision_refusal("fp16"),
        adam=adam_facts(offload=False),
        monitors={pkg: _installed_version(pkg) for pkg, _ in MONITOR_PACKAGES.values()},
        device_bytes=torch.cuda.get_device_properties(local_rank).total_memory if on_gpu else None,
        device_name=torch.cuda.get_device_name(local_rank) if on_gpu else None,
        compile_blocker=compile_blocker(device_type),
        host_ram=(ram.bytes, ram.limit),
    )


def _installed_version(package: str) -> str | None:
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # importable but not pip-installed: no version
        return "0"


def compile_blocker(device_type: str) -> str | None:
    """Why torch.compile's default backend (inductor) cannot run on `device_type`, or None."""
    import torch

    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if device_type == "cpu":
        cxx = os.environ.get("CXX") or "c++"
        if shutil.which(cxx) is None and shutil.which("g++") is None:
            return f"inductor needs a C++ compiler on CPU and {cxx!r}/'g++' is not on PATH"
        return None
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "inductor needs Triton on the GPU and it is not installed"
    return None
