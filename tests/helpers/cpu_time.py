"""CPU seconds per test, for deciding where the suite's time goes.

Under `pytest -n 2` a test's wall time says as much about the other worker as about the test:
a 2-rank test beside an 8-rank one gets a fifth of the machine. What a test costs the suite is
the CPU its process tree spends: its worker, and every process the worker or the suite's zygote
started during it (a process's own time plus what it collected from the children it waited
for, as the kernel counts them). Ranks started by a loopback sshd are the sshd's, not counted.

    GPT_DS_TEST_CPU_LOG=cpu.jsonl .venv/bin/python -m pytest -n 2    # one line a test
    python tests/helpers/cpu_time.py cpu.jsonl                     # the largest, by test and file
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

CPU_LOG_ENV = "GPT_DS_TEST_CPU_LOG"


def tree_cpu_seconds() -> float:
    """User and system seconds of this process and its live descendants, with what each has
    collected from the children it waited for."""
    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended between the listing and the read: its parent has it
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuTimes:
    """A pytest plugin that appends {"test", "cpu_s", "wall_s"} per test to `log`."""

    def __init__(self, log: Path):
        self.log = log

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        cpu, wall = tree_cpu_seconds(), time.monotonic()
        yield
        record = {
            "test": item.nodeid,
            "cpu_s": round(tree_cpu_seconds() - cpu, 2),
            "wall_s": round(time.monotonic() - wall, 2),
        }
        with self.log.open("a") as f:  # one short line an append: workers do not interleave
            f.write(json.dumps(record) + "\n")


def register_if_asked(config: pytest.Config) -> None:
    """Records CPU times when $GPT_DS_TEST_CPU_LOG names a file (xdist workers inherit it)."""
    log = os.environ.get(CPU_LOG_ENV)
    if log:
        config.pluginmanager.register(CpuTimes(Path(log).resolve()), "gpt_ds_cpu_times")


def summary(records: list[dict], top: int = 40) -> str:
    """The total, the `top` tests and test files by CPU seconds."""
    total = sum(r["cpu_s"] for r in records)
    by_file: Counter[str] = Counter()
    for r in records:
        by_file[r["test"].split("::")[0]] += r["cpu_s"]
    largest = sorted(records, key=lambda r: -r["cpu_s"])[:top]
    lines = [f"{len(records)} tests, {total:.0f} CPU s ({total / 60:.1f} CPU min)", ""]
    lines += [f"{r['cpu_s']:8.1f} s  {r['test']}" for r in largest]
    lines += ["", "by file:"]
    lines += [f"{s:8.1f} s  {name}" for name, s in by_file.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line]
    print(summary(rows))
