"""`--compile`: torch.compile of the model through the DeepSpeed engine (`engine.compile()`),
on GPUs by default (`auto`), where inductor fuses the elementwise passes and cuts the kernels
the host launches per step (one H100, GPT-2 124M: 1.24x the eager tokens/s at two thirds of the
memory, BENCHMARKS.md); off on CPU ranks, where compiling takes minutes per launch.

The compiled graphs are built on the first forward and backward, so the first iteration
carries the compile time (the trainer reports it apart from the steady-state speed). Where
torch.compile cannot work, the run goes on eager and says so at start-up in a WARNING line
naming why: no C++ compiler for inductor on CPU, no Triton for it on a GPU, or
`engine.compile()` itself refusing. Nothing else is hidden: dynamo's process-wide
`suppress_errors` is left as torch sets it, so a graph that fails to compile later is torch's to
report, with its own error.
The chunked loss stays eager (`torch.compiler.disable` in chunked_loss.py): it is a loop of
large matmuls that compile would only unroll.
"""

from __future__ import annotations

import os
import shutil

import torch


def compile_blocker(device_type: str) -> str | None:
    """Why torch.compile's default backend (inductor) cannot run here, or None."""
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


def wants_compile(mode: str, device_type: str) -> bool:
    """Whether `--compile` `mode` (auto, on, off) compiles on a `device_type` device."""
    return mode == "on" or (mode == "auto" and device_type == "cuda")


def compile_engine(engine, device_type: str) -> str:
    """Compile the engine's module; returns the line for the log: compiled, or a WARNING
    saying why not and that the run trains eager."""
    blocker = compile_blocker(device_type)
    if blocker is None:
        try:
            engine.compile()
        except (RuntimeError, ValueError) as exc:
            blocker = f"engine.compile() refused: {exc}"
    if blocker is not None:
        return f"WARNING: --compile: cannot compile, the run trains eager: {blocker}"
    return "--compile: model compiled by torch.compile (inductor); the first iteration compiles"
