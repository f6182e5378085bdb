"""Which precision a run gets where the user said `auto`: bf16 where the hardware has it,
fp16 on older GPUs, else fp32 (decided from the accelerator, or /proc/cpuinfo on CPU); and
whether the precision a run asks for can train here at all (fp16 on a CPU mostly cannot).

The decisions are pure functions of what the hardware reports (`gpu_precision`,
`cpu_precision`, `fp16_refusal`), so they are tested for GPUs this machine does not have; the
functions without arguments ask the accelerator DeepSpeed will use."""

from __future__ import annotations

from pathlib import Path

PRECISIONS = ("bf16", "fp16", "fp32")


# ----------------------------------------------------------------------------------------------
# Precision detection


def detect_precision() -> tuple[str, str]:
    """The training precision this machine runs best, and why: ("bf16"|"fp16"|"fp32", reason).

    Uses the accelerator DeepSpeed will use: CUDA/ROCm by `gpu_precision`, CPU by
    `cpu_precision`, any other by what the accelerator says it supports.
    """
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    device = accelerator.device_name()
    if device == "cpu":
        return cpu_precision(_read_cpuinfo())
    if device == "cuda":
        import torch

        kind = "ROCm" if torch.version.hip else "CUDA"
        # The default including_emulation=True answers True on a V100, where bf16 is emulated.
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return gpu_precision(kind, torch.cuda.get_device_name(), native)
    if accelerator.is_bf16_supported():
        return "bf16", f"{device} accelerator supports bf16"
    if accelerator.is_fp16_supported():
        return "fp16", f"{device} accelerator supports fp16 but not bf16"
    return "fp32", f"{device} accelerator supports neither bf16 nor fp16"


def gpu_precision(kind: str, name: str, native_bf16: bool) -> tuple[str, str]:
    """Precision for a CUDA or ROCm device (`kind`) named `name`: bf16 where it computes bf16
    natively (Ampere and newer, every ROCm GPU torch supports), else fp16 with DeepSpeed's
    dynamic loss scaling (V100, T4: bf16 would be emulated, several times slower)."""
    if native_bf16:
        return "bf16", f"{kind} device {name} supports bf16"
    return "fp16", f"{kind} device {name} has no native bf16; fp16 with dynamic loss scaling"


def _read_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpu_precision(cpuinfo: str | None) -> tuple[str, str]:
    """Precision for a CPU run from /proc/cpuinfo text (x86 `flags`, Arm `Features`)."""
    if cpuinfo is None:
        return "fp32", "no GPU and /proc/cpuinfo is unreadable: cannot tell whether bf16 is native"
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if "amx_bf16" in flags:
        return "bf16", "CPU reports AMX-BF16"
    if "avx512_bf16" in flags:
        return "bf16", "CPU reports AVX512-BF16"
    if "bf16" in flags:
        return "bf16", "CPU reports Arm BF16"
    return "fp32", "no GPU, and the CPU reports neither amx_bf16 nor avx512_bf16 (bf16 is emulated)"


# ----------------------------------------------------------------------------------------------
# What the hardware refuses


def fp16_refusal(device: str, fp16_supported: bool, cpuinfo: str | None) -> str | None:
    """Why fp16 cannot train on `device` (None where it can), with what to use instead.

    DeepSpeed's CPU accelerator accepts fp16 only where oneDNN computes it (CPUs with
    AVX512-FP16 / AMX-FP16); elsewhere `deepspeed.initialize` raises "Type fp16 is not
    supported on your device." after the model is built. Said here before anything is built.
    """
    if fp16_supported or device != "cpu":
        return None
    best, why = cpu_precision(cpuinfo)
    instead = (
        f"--precision bf16 (native here: {why}) or --precision fp32"
        if best == "bf16"
        else "--precision fp32 (this CPU has no native bf16 either)"
    )
    return (
        "fp16 with dynamic loss scaling needs a GPU: DeepSpeed's CPU accelerator refuses fp16 "
        f"on this machine (the CPU has no native fp16 arithmetic); use {instead}"
    )


def precision_refusal(precision: str) -> str | None:
    """`fp16_refusal` for this machine's accelerator when `precision` is fp16, else None."""
    if precision != "fp16":
        return None
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    device = accelerator.device_name()
    cpuinfo = _read_cpuinfo() if device == "cpu" else None
    return fp16_refusal(device, bool(accelerator.is_fp16_supported()), cpuinfo)
