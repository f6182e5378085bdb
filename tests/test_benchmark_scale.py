"""benchmarks/scale.py runs at a tiny size, so it cannot rot. Nothing here asserts a speed or a
size limit: only that the row ran, its columns agree with each other, and a model predicted
not to fit the RAM is reported, not launched."""

from __future__ import annotations

import os
import re

import pytest
from harness.launch import run_benchmark

pytestmark = pytest.mark.bench  # the benchmark smoke tests: `pytest -m bench`

RAN = re.compile(
    r"^\| gpt2-tiny \| (\d+)M \| ([\d.]+) GiB \(([\d.]+) \+ ([\d.]+)\) \| ([\d.]+) GiB \| "
    r"([\d.]+) \| ([\d.]+) GiB \| ([\d.]+) \| (fits|refuses) \| ran \|$",
    re.M,
)
# gpt2-xl's estimate is ~19.8 GiB per rank: on a machine this small it must not be launched
SMALL_HOST = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") < 32 * 2**30
NOT_RUN = re.compile(r"^\| gpt2-xl \| [\d,]+M \| [\d.]+ GiB \| .* \| refuses \| not run: ", re.M)


@pytest.mark.slow
def test_scale_benchmark_measures_tiny_and_skips_what_cannot_fit(shakespeare_dir, tmp_path):
    proc = run_benchmark(
        "scale",
        "--models", "gpt2-tiny", *(["gpt2-xl"] if SMALL_HOST else []),
        "--release_off",
        "--steps", "2",
        data_dir=shakespeare_dir,
        work_dir=tmp_path,
    )  # fmt: skip
    rows = RAN.findall(proc.stdout)
    assert len(rows) == 1, proc.stdout
    params, predicted, estimate, baseline, peak, ratio, start, secs, guard = rows[0]
    assert int(params) == 7 and guard == "fits"
    assert float(predicted) == pytest.approx(float(estimate) + float(baseline), abs=0.011)
    assert float(baseline) > 0.1 and 0.1 < float(start) <= float(peak) + 0.01
    assert float(ratio) == pytest.approx(float(peak) / float(predicted), abs=0.02)
    assert float(secs) > 0
    if SMALL_HOST:  # 1.56B parameters x 16 bytes / 2 ranks and more: reported, never launched
        assert NOT_RUN.search(proc.stdout), proc.stdout
        assert not (tmp_path / "gpt2-xl_release_auto").exists()
