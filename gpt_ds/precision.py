"""Which precision a run gets where the user said `auto`: bf16 where the hardware has it,
fp16 on older GPUs, else fp32 (decided from the accelerator, or /proc/cpuinfo on CPU)."""

from __future__ import annotations

from pathlib import Path

PRECISIONS = ("bf16", "fp16", "fp32")


# ----------------------------------------------------------------------------------------------
# Precision detection


def detect_precision() -> tuple[str, str]:
    """The training precision this machine runs best, and why: ("bf16"|"fp16"|"fp32", reason).

    Uses the accelerator DeepSpeed will use. CUDA/ROCm: bf16 where the GPU has it natively
    (Ampere+, every ROCm GPU), else fp16. CPU: bf16 when the CPU reports AMX-BF16 or AVX512-BF16
    (or Arm BF16), else fp32.
    """
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    device = accelerator.device_name()
    if device == "cpu":
        return cpu_precision(_read_cpuinfo())
    if device == "cuda":
        import torch

        kind = "ROCm" if torch.version.hip else "CUDA"
        name = torch.cuda.get_device_name()
        # The default including_emulation=True answers True on a V100, where bf16 is emulated.
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return "bf16", f"{kind} device {name} supports bf16"
        return "fp16", f"{kind} device {name} has no native bf16; fp16 with dynamic loss scaling"
    if accelerator.is_bf16_supported():
        return "bf16", f"{device} accelerator supports bf16"
    if accelerator.is_fp16_supported():
        return "fp16", f"{device} accelerator supports fp16 but not bf16"
    return "fp32", f"{device} accelerator supports neither bf16 nor fp16"


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
