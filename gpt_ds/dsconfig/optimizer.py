"""Which Adam(W) implementation a run gets, so that no run dies in `deepspeed.initialize` for
want of a compiler.

DeepSpeed turns `"optimizer": {"type": "AdamW"}` into its FusedAdam on a CUDA/ROCm accelerator,
and FusedAdam JIT-compiles its kernel at construction unless DeepSpeed was installed with the
op prebuilt (deepspeed/runtime/engine.py `get_optimizer_configuration`, ops/op_builder/builder.py
`load` / `jit_load`). PyPI's torch wheels carry the CUDA runtime but no `nvcc`, so on a plain
pip install that build fails on every rank, after the model is built. `"torch_adam": true` makes
DeepSpeed use `torch.optim.AdamW`, whose `fused=True` kernel ships inside torch (CUDA, ROCm).

`choose_adam` is a pure function of what the machine has (`AdamFacts`), tested for every branch;
`adam_facts` reads those facts from the installed torch and DeepSpeed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# Keys only DeepSpeed's FusedAdam takes: torch's AdamW raises TypeError on them.
FUSED_ADAM_ONLY_KEYS = ("bias_correction", "set_grad_none")


@dataclass(frozen=True)
class AdamFacts:
    """What decides the implementation: the accelerator DeepSpeed uses ("cpu", "cuda", ...),
    whether it is ROCm, whether DeepSpeed's fused_adam op is prebuilt for it, and whether a
    compiler able to JIT-build it is present (`compiler` says which, for the report)."""

    accelerator: str
    rocm: bool = False
    prebuilt: bool = False
    compiler: str | None = None
    offload: bool = False
    compiler_blocked: str | None = None  # why the compiler cannot build the op, if it cannot


@dataclass
class AdamChoice:
    """The optimizer params to set (DeepSpeed config `optimizer.params`) and the report line."""

    params: dict = field(default_factory=dict)
    note: str = ""
    problems: list[str] = field(default_factory=list)


def choose_adam(facts: AdamFacts, params: dict) -> AdamChoice:
    """The Adam(W) implementation for a config whose optimizer params are `params` (not
    modified). A `torch_adam` the user set is kept; otherwise:

    - optimizer offload: DeepSpeed's CPU Adam (a C++ build, no GPU compiler needed);
    - CPU ranks: torch's AdamW (exact resume: it recomputes bias corrections; no compile);
    - GPU with the op prebuilt, or a compiler that can build it: DeepSpeed's FusedAdam;
    - GPU without either: torch's AdamW(fused=True), which needs no build;
    - other accelerators: DeepSpeed's own choice.
    """
    return _checked(_implementation(facts, params), params)


def _implementation(facts: AdamFacts, params: dict) -> AdamChoice:
    """`choose_adam`'s pick and its report line, before the params are checked."""
    if "torch_adam" in params:
        impl = "torch AdamW" if params["torch_adam"] else "DeepSpeed's Adam"
        return AdamChoice(note=f"optimizer: {impl} (torch_adam set in the config)")
    if facts.offload:
        return AdamChoice(note="optimizer: DeepSpeed CPU Adam (optimizer offload)")
    if facts.accelerator == "cpu":
        why = "CPU ranks: exact resume, no kernel compile"
        return AdamChoice({"torch_adam": True}, f"optimizer: torch AdamW ({why})")
    if facts.accelerator != "cuda":
        return AdamChoice(note=f"optimizer: DeepSpeed's choice on {facts.accelerator}")
    kind = "ROCm" if facts.rocm else "CUDA"
    if facts.prebuilt:
        return AdamChoice(note="optimizer: DeepSpeed FusedAdam (op prebuilt)")
    if facts.compiler and not facts.compiler_blocked:
        note = f"optimizer: DeepSpeed FusedAdam (JIT-built once with {facts.compiler})"
        return AdamChoice(note=note)
    compiler = "hipcc" if facts.rocm else "nvcc matching torch's CUDA version"
    why = f"no {compiler} to build DeepSpeed's FusedAdam on this {kind} machine"
    why += ", and it is not prebuilt"
    choice = {"torch_adam": True}
    if params.get("foreach") is None:  # torch refuses fused together with foreach
        choice["fused"] = True
    fused = "fused=True, " if "fused" in choice else ""
    note = f"optimizer: torch AdamW ({fused}built into torch): {facts.compiler_blocked or why}"
    return AdamChoice(choice, note)


def _checked(choice: AdamChoice, params: dict) -> AdamChoice:
    """Problems of the final params: keys the chosen implementation would raise TypeError on,
    and torch's refusal of `fused` together with `foreach`."""
    final = {**params, **choice.params}
    torch_adam = bool(final.get("torch_adam"))
    where = "optimizer.params"
    if torch_adam:
        for key in FUSED_ADAM_ONLY_KEYS:
            if key in final:
                choice.problems.append(
                    f"{where}.{key} is an option of DeepSpeed's FusedAdam, which this run does "
                    f"not use ({choice.note.removeprefix('optimizer: ')}): torch's AdamW "
                    f"always bias-corrects and sets gradients to None; remove {key}"
                )
        if final.get("fused") and final.get("foreach"):
            choice.problems.append(
                f"{where}.fused and {where}.foreach are both true: torch's AdamW takes one; "
                "remove foreach (fused is faster on GPUs)"
            )
    elif "fused" in final:
        choice.problems.append(
            f'{where}.fused is an option of torch\'s AdamW: add "torch_adam": true to use it, '
            "or remove fused"
        )
    return choice


# ----------------------------------------------------------------------------------------------
# The live facts


def adam_facts(offload: bool) -> AdamFacts:
    """`AdamFacts` of this machine, as DeepSpeed and torch will see them."""
    import torch
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    name = accelerator.device_name()
    if name != "cuda":
        return AdamFacts(accelerator=name, offload=offload)
    rocm = torch.version.hip is not None
    return AdamFacts(
        accelerator=name,
        rocm=rocm,
        prebuilt=_fused_adam_prebuilt(accelerator._name),
        compiler=_rocm_compiler() if rocm else _cuda_compiler(torch.version.cuda),
        offload=offload,
        compiler_blocked=None if rocm else arch_list_blocker(os.environ.get(ARCH_LIST, "")),
    )


ARCH_LIST = "TORCH_CUDA_ARCH_LIST"


def arch_list_blocker(arch_list: str) -> str | None:
    """Why DeepSpeed 0.19's JIT builder would fail on this TORCH_CUDA_ARCH_LIST, or None.

    Its `compute_capability_args` sorts the entries by `int()` of each dotted part, so torch's
    arch-specific entries ("9.0a", "10.0f", which Hopper/Blackwell builds set) raise ValueError
    when FusedAdam is constructed, after the model is built. torch's fused AdamW needs no build.
    """
    for entry in arch_list.replace(" ", ";").split(";"):
        entry = entry.strip()
        if entry and not re.fullmatch(r"\d+\.\d+(\+PTX)?", entry):
            return (
                f"{ARCH_LIST}={arch_list!r} has {entry!r}, which DeepSpeed's JIT builder cannot "
                f"parse (FusedAdam would fail to build; unset it or write {entry.rstrip('af')!r} "
                "to build it)"
            )
    return None


def _fused_adam_prebuilt(accelerator_name: str) -> bool:
    """DeepSpeed's own test before it imports a prebuilt op (op_builder/builder.py `load`)."""
    from deepspeed.git_version_info import accelerator_name as built_for
    from deepspeed.git_version_info import installed_ops

    return bool(installed_ops.get("fused_adam")) and built_for == accelerator_name


def _cuda_compiler(torch_cuda: str | None) -> str | None:
    """ "nvcc 12.4" when CUDA_HOME's nvcc and ninja can build for this torch (same CUDA major
    and minor version as torch was built with), else None."""
    from torch.utils.cpp_extension import CUDA_HOME

    if not CUDA_HOME or not torch_cuda or shutil.which("ninja") is None:
        return None
    version = nvcc_version(Path(CUDA_HOME) / "bin" / "nvcc")
    return f"nvcc {version}" if version and same_minor(version, torch_cuda) else None


def _rocm_compiler() -> str | None:
    from torch.utils.cpp_extension import ROCM_HOME

    if not ROCM_HOME or shutil.which("ninja") is None:
        return None
    hipcc = Path(ROCM_HOME) / "bin" / "hipcc"
    return "hipcc" if hipcc.exists() else None


def nvcc_version(nvcc: Path) -> str | None:
    """ "12.4" from `nvcc --version` ("Cuda compilation tools, release 12.4, V12.4.131")."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+\.\d+)", out.stdout)
    return match.group(1) if match else None


def same_minor(a: str, b: str) -> bool:
    """ "12.4" and "12.4.1" agree; "12.4" and "13.0" do not."""
    return a.split(".")[:2] == b.split(".")[:2]
