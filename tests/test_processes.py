"""gpt_ds.base.processes: a process's /proc facts, and `PeakSampler`, the one peak sampler of the
package (the export's anonymous memory, the benchmarks' ranks), against what /proc says itself."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time

import pytest

from gpt_ds.base.processes import (
    PeakSampler,
    command_line,
    parent_pid,
    pid_alive,
    process_identity,
    status_bytes,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")


def gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_process_has_facts_and_a_gone_one_none():
    me = os.getpid()
    assert pid_alive(me) and parent_pid(me) == os.getppid()
    assert sys.executable.rsplit("/", 1)[-1] in command_line(me)
    assert process_identity(me) == process_identity(me) is not None
    gone = gone_pid()
    assert not pid_alive(gone) and process_identity(gone) is None and parent_pid(gone) is None
    assert command_line(gone) == "" and status_bytes(gone, "VmHWM") is None
    assert status_bytes("self", "NoSuchField") is None


def fresh_pages(size: int) -> mmap.mmap:
    """`size` bytes of new anonymous memory, every page written. Its own mapping, not the heap:
    a long-lived worker's heap may hold freed pages that are already resident."""
    block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    return block


def test_the_sampler_sees_a_peak_the_kernel_does_not_keep():
    """RssAnon has no high-water mark: 64 MiB held for 0.2 s and freed shows in the sampled
    peak, not in the value read afterwards."""
    with PeakSampler("RssAnon") as anon:
        before = status_bytes("self", "RssAnon")
        block = fresh_pages(64 << 20)
        time.sleep(0.2)
        block.close()
        time.sleep(0.05)
    assert before is not None and anon.peak_bytes is not None
    assert anon.peak_bytes >= before + (48 << 20)


def test_the_sampler_reads_each_named_process_and_skips_gone_ones():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        sampler = PeakSampler("VmHWM", lambda: [child.pid, gone_pid()])
        sampler.sample()
        assert list(sampler.peaks) == [child.pid]
        assert 0 < sampler.peak_bytes <= status_bytes(child.pid, "VmHWM")  # still starting
    finally:
        child.kill()
        child.wait()
    assert PeakSampler("VmHWM", lambda: []).peak_bytes is None
