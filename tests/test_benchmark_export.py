"""benchmarks/export.py at a tiny size, so it cannot rot. A benchmark is not a test: nothing
here asserts a speed, only that it trained, ran every row and printed a complete table."""

from __future__ import annotations

import re

import pytest
from harness.launch import run_benchmark

pytestmark = pytest.mark.bench  # the benchmark smoke tests: `pytest -m bench`

ROW = re.compile(
    r"^\| (?P<tool>[^|]+?) \| (?P<median>[\d.]+) \| (?P<reps>[\d. /]+?) \| (?P<rss>[\d.]+) GiB "
    r"\| (?P<anon>[\d.]+) GiB \| (?P<x_rss>[\d.]+) / (?P<x_anon>[\d.]+) \| (?P<x_time>[\d.]+) \|$",
    re.M,
)


@pytest.mark.slow
def test_export_benchmark_prints_every_row(shakespeare_dir, tmp_path):
    proc = run_benchmark(
        "export", "--model", "gpt2-tiny", "--reps", "1",
        data_dir=shakespeare_dir, work_dir=tmp_path, timeout=900,
    )  # fmt: skip
    rows = {m["tool"]: m for m in ROW.finditer(proc.stdout)}
    assert list(rows) == ["gpt_ds tools/zero_to_fp32.py", "DeepSpeed zero_to_fp32.py"], proc.stdout
    for m in rows.values():
        numbers = [m[k] for k in ("median", "rss", "anon", "x_rss", "x_anon", "x_time")]
        assert all(float(x) > 0 for x in numbers), m.group(0)
        assert m["reps"] == m["median"]  # one repetition: it is the median
    assert rows["DeepSpeed zero_to_fp32.py"]["x_time"] == "1.00"  # the reference row
    assert (tmp_path / "gpt2-tiny_zero2" / "latest").is_file()  # a real training run made it
