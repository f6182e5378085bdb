"""A rank's resident memory (RSS): its peak, and glibc's habit of keeping what a step freed.

Measured on this project's CPU machines (BENCHMARKS.md): a ZeRO-3 step of gpt2-medium on 4
ranks peaked at 5.0-5.5 GiB RSS per rank against 3.3 GiB of live tensors. The difference is
glibc's heap: blocks a step frees (gathered parameters, reduction buckets) are kept for reuse,
and the next allocations of other sizes grow the heap instead. A fixed mmap threshold makes
every block from 1 MiB up its own mapping, handed back to the kernel when freed: the same run
then peaks at 3.3 GiB at the same step time. On small models, whose steps allocate and free
multi-MiB activations many times a second, the page faults cost 10-35% of the speed, so `auto`
releases only for models of 100M parameters and more on CPU ranks, where the host memory is
the training memory and the saving is gigabytes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
RELEASE_THRESHOLD = 1 << 20  # blocks from 1 MiB up: mapped, and unmapped when freed
AUTO_MIN_PARAMS = 100_000_000
CHOICES = ("auto", "on", "off")


def peak_rss_gib() -> float:
    """This process's peak resident set size so far, in GiB (Linux reports KiB, macOS bytes):
    the one peak-RSS reading of the package (training metrics, the export's summary)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 * (1 if sys.platform == "darwin" else 1024)


def wants_release(choice: str, device_type: str, num_params: int) -> bool:
    """Whether to release freed blocks: `on`/`off` as asked; `auto` on CPU for large models."""
    if choice != "auto":
        return choice == "on"
    return device_type == "cpu" and num_params >= AUTO_MIN_PARAMS


def release_freed_blocks() -> str:
    """Set glibc's mmap threshold (fixed: no more dynamic raising); a line for the log."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, RELEASE_THRESHOLD) == 1
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        ok = False
    if not ok:
        return "host memory: this C library has no mallopt; freed blocks stay with the process"
    return (
        "host memory: blocks of 1 MiB and more go back to the kernel when freed "
        "(--release_host_memory)"
    )
