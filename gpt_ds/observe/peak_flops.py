"""Peak dense 16-bit matmul throughput of known accelerators, for MFU: the table the logger's
`resolve_peak` reads on a GPU (imported there only; a CPU run has no peak to compare with).

Keyed by the exact model in the name the driver reports (`torch.cuda.get_device_name()`), so a
PCIe card does not get its SXM sibling's figure and "L40" never matches "L40S". Figures are
the vendors' dense matrix peaks (no structured sparsity) in the precision a run trains there:
bf16 where the card has it natively (launch/machine.py `gpu_precision` picks bf16 there), fp16
on V100 / T4-class cards (which train fp16). In TFLOP/s per device torch sees: an MI250X/MI250
package is two GCDs, each its own device and rank, so those rows are half the package figure.
An unknown device gives None and the trainer says so once (`--peak_tflops` sets it).
"""

from __future__ import annotations

import re

# (model, pattern over the upper-cased device name, dense TFLOP/s); first match wins, so each
# variant comes before its family's plain name. Sources: NVIDIA and AMD datasheets; AMD's
# rows are its published "Peak FP16/BF16 (dense) matrix" TFLOPs (amd.com product spec pages),
# which are CUs x matrix FLOP/clock/CU x peak engine clock, as the comments recompute.
PEAK_TFLOPS: tuple[tuple[str, str, float], ...] = (
    ("GB200", r"\bGB200\b", 2500.0),
    ("B200", r"\bB200\b", 2250.0),
    ("B100", r"\bB100\b", 1750.0),
    ("GH200", r"\bGH200\b", 989.4),
    ("H200 NVL", r"\bH200\b.*\bNVL\b", 835.0),
    ("H200", r"\bH200\b", 989.4),
    ("H100 NVL", r"\bH100\b.*\bNVL\b", 835.0),
    ("H100 PCIe", r"\bH100\b.*\bPCIE\b", 756.0),
    ("H100 SXM", r"\bH100\b", 989.4),  # "H100 80GB HBM3", "H100 SXM5 80GB"
    ("H800 PCIe", r"\bH800\b.*\bPCIE\b", 756.0),
    ("H800", r"\bH800\b", 989.4),
    ("H20", r"\bH20\b", 148.0),
    ("A100", r"\bA100\b", 312.0),  # SXM4 and PCIe, 40 and 80 GB alike
    ("A800", r"\bA800\b", 312.0),
    ("A30", r"\bA30\b", 165.0),
    ("A10G", r"\bA10G\b", 125.0),
    ("A10", r"\bA10\b", 125.0),
    ("L40S", r"\bL40S\b", 362.1),
    ("L40", r"\bL40\b", 181.0),
    ("L20", r"\bL20\b", 119.5),
    ("L4", r"\bL4\b", 121.0),
    ("V100S", r"\bV100S\b", 130.0),
    ("V100 PCIe", r"\bV100\b.*\bPCIE\b", 112.0),
    ("V100", r"\bV100\b", 125.0),
    ("RTX 6000 Ada", r"\bRTX 6000 ADA\b", 364.2),
    ("RTX 4090", r"\bRTX 4090\b", 165.2),
    ("RTX 3090", r"\bRTX 3090\b", 71.0),
    ("MI355X", r"\bMI355X\b", 2500.0),
    ("MI350X", r"\bMI350X\b", 2300.0),
    ("MI325X", r"\bMI325X\b", 1307.4),
    ("MI300X", r"\bMI300X\b", 1307.4),
    ("MI300A", r"\bMI300A\b", 980.6),
    # MI250X / MI250: AMD lists 383.0 / 362.1 TFLOPs bf16 for the OAM package, 2 GCDs (220 /
    # 208 CUs x 1024 x 1.7 GHz); torch shows each GCD as a device, run by one rank. The name
    # ROCm reports for both is often "AMD Instinct MI250X/MI250": MI250X's figure then.
    ("MI250X (1 GCD)", r"\bMI250X\b", 191.5),
    ("MI250 (1 GCD)", r"\bMI250\b", 181.0),
    ("MI210", r"\bMI210\b", 181.0),  # one GCD, 104 CUs x 1024 x 1.7 GHz
    # MI100: 184.6 TFLOPs is its fp16 peak; bf16 (what ROCm runs train) is half: 92.3
    ("MI100", r"\bMI100\b", 92.3),
    # Radeon, RDNA4: AI PRO R9700, 64 CUs x 1024 x 2.92 GHz = 191 TFLOPs fp16/bf16 dense
    # (AMD: 191 dense, 383 with sparsity)
    ("Radeon AI PRO R9700", r"\bR9700\b", 191.0),
    # Radeon, RDNA3 (WMMA, bf16 at the fp16 rate, 512 FLOP/clock/CU): AMD's peak fp16 figures
    # 7900 XTX 96 CUs x 2.5 GHz = 122.8, XT 84 x 2.4 = 103 (as AMD rounds it), GRE 80 x 2.245
    # = 91.96
    ("RX 7900 XTX", r"\bRX 7900 XTX\b", 122.8),
    ("RX 7900 XT", r"\bRX 7900 XT\b", 103.0),
    ("RX 7900 GRE", r"\bRX 7900 GRE\b", 91.96),
)


def lookup(device_name: str) -> tuple[str, float] | None:
    """(model, dense TFLOP/s) for a device name such as "NVIDIA H100 PCIe", or None."""
    name = device_name.upper().replace("-", " ").replace("_", " ")
    for model, pattern, tflops in PEAK_TFLOPS:
        if re.search(pattern, name):
            return model, tflops
    return None
