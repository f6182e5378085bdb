"""helpers/cpu_time.py: a test's CPU seconds count the processes it started, not its wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers.cpu_time import CPU_LOG_ENV, summary
from support.launch import REPO

TESTS = """
import subprocess, sys, time

def test_a_child_burns_a_second():
    burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)

def test_waiting_costs_nothing():
    time.sleep(1)
"""
CONFTEST = """
from helpers.cpu_time import register_if_asked

def pytest_configure(config):
    register_if_asked(config)
"""


def test_a_child_process_counts_and_a_sleep_does_not(tmp_path):
    (tmp_path / "test_two.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    log = tmp_path / "cpu.jsonl"
    env = {**os.environ, CPU_LOG_ENV: str(log), "PYTHONPATH": str(REPO / "tests")}
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    proc = subprocess.run([*cmd, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["test"].split("::")[1]: r for r in map(json.loads, log.read_text().splitlines())}
    burnt, waited = records["test_a_child_burns_a_second"], records["test_waiting_costs_nothing"]
    assert 0.9 <= burnt["cpu_s"] < 3, burnt
    assert waited["cpu_s"] < 0.5 and waited["wall_s"] >= 1, waited
    said = summary(list(records.values()))
    assert said.startswith("2 tests, ") and "test_two.py::test_a_child_burns_a_second" in said
