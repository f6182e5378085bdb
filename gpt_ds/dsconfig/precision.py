"""Which precision a run gets where the user said `auto`: bf16 where the hardware has it,
fp16 on older GPUs DeepSpeed trains fp16 on (V100, T4), else fp32 (decided from the
accelerator, or /proc/cpuinfo on CPU); and whether the precision a run asks for can train here
at all (fp16 on CPU ranks never does, nor on a GPU of compute capability below 7.0).

The decisions are pure functions of what the hardware reports (`gpu_precision`,
`cpu_precision`, `fp16_refusal`), so they are tested for GPUs this machine does not have;
launch/machine.py asks the accelerator DeepSpeed will use and hands its answers to them."""

from __future__ import annotations

PRECISIONS = ("bf16", "fp16", "fp32")


# ----------------------------------------------------------------------------------------------
# The precision a machine trains best


def gpu_precision(
    kind: str, name: str, native_bf16: bool, capability: tuple[int, int]
) -> tuple[str, str]:
    """Precision for a CUDA or ROCm device (`kind`) named `name` of compute `capability`:
    bf16 where it computes bf16 natively (Ampere and newer, every ROCm GPU torch supports), else
    fp16 with DeepSpeed's dynamic loss scaling (V100, T4: bf16 would be emulated, several times
    slower), except where DeepSpeed's CUDA accelerator refuses fp16 (capability < 7.0: P100,
    GTX 10xx), which trains fp32: picking fp16 there would only fail later, in DeepSpeed."""
    if native_bf16:
        return "bf16", f"{kind} device {name} supports bf16"
    if cuda_fp16_refusal(kind, capability) is not None:
        major, minor = capability
        return "fp32", (
            f"{kind} device {name} (compute capability {major}.{minor}) has no native bf16, and "
            "DeepSpeed refuses fp16 below compute capability 7.0"
        )
    return "fp16", f"{kind} device {name} has no native bf16; fp16 with dynamic loss scaling"


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


def cuda_fp16_refusal(kind: str, capability: tuple[int, int]) -> str | None:
    """Why DeepSpeed's CUDA accelerator refuses fp16 on a `kind` GPU of compute `capability`
    (None where it accepts it), with what to use instead.

    DeepSpeed's `accelerator/cuda_accelerator.py` `is_fp16_supported` answers False below
    capability 7.0 (fp16 on 6.x is deprecated; DS_ALLOW_DEPRECATED_FP16=1 lets 6.x through, and
    that answer reaches `fp16_refusal` instead), and `deepspeed.initialize` then raises "Type
    fp16 is not supported on your device." after the model is built. ROCm GPUs report
    capability >= 9.
    """
    major, minor = capability
    if kind != "CUDA" or major >= 7:
        return None
    return (
        f"fp16 needs compute capability 7.0 or newer: DeepSpeed refuses it on this GPU (compute "
        f"capability {major}.{minor}, e.g. P100 or GTX 10xx; it has no native bf16 either); use "
        "--precision fp32 (on 6.x, DS_ALLOW_DEPRECATED_FP16=1 makes DeepSpeed accept fp16)"
    )


def fp16_refusal(
    device: str, fp16_supported: bool, cpuinfo: str | None, capability: tuple[int, int] | None
) -> str | None:
    """Why fp16 cannot train on `device` (None where it can), with what to use instead.

    DeepSpeed's CUDA accelerator accepts fp16 only from compute `capability` 7.0
    (`cuda_fp16_refusal`); elsewhere `deepspeed.initialize` raises "Type fp16 is not supported
    on your device." after the model is built. On CPU ranks gpt_ds refuses fp16 whatever the
    CPU (`cpu_fp16_refusal`). Said here, before anything is built.
    """
    if device == "cpu":
        return cpu_fp16_refusal(fp16_supported, cpuinfo)
    if fp16_supported:
        return None
    if device == "cuda" and capability is not None:
        return cuda_fp16_refusal("CUDA", capability)
    return None


def cpu_fp16_refusal(fp16_supported: bool, cpuinfo: str | None) -> str:
    """Why gpt_ds trains no fp16 on CPU ranks, whether or not DeepSpeed's CPU accelerator would
    (`fp16_supported`: oneDNN computes fp16 on AVX512-FP16 / AMX-FP16 CPUs).

    fp16 with loss scaling exists for GPUs without bf16. Every x86 CPU with native fp16 also
    has native bf16 (Sapphire Rapids and newer: AMX-BF16), which needs no loss scaling; and one
    answer for every CPU keeps a command, and the suite, behaving the same on every machine.
    """
    best, why = cpu_precision(cpuinfo)
    instead = (
        f"--precision bf16 (native here: {why}) or --precision fp32"
        if best == "bf16"
        else "--precision fp32 (this CPU has no native bf16 either)"
    )
    here = (
        "gpt_ds does not train fp16 on CPU ranks (this CPU computes fp16, but bf16 needs no "
        "loss scaling)"
        if fp16_supported
        else "DeepSpeed's CPU accelerator refuses fp16 on this machine (the CPU has no native "
        "fp16 arithmetic)"
    )
    return f"fp16 with dynamic loss scaling needs a GPU: {here}; use {instead}"
