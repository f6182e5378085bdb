"""benchmarks/activation_checkpointing.py runs at a tiny size, so it cannot rot. Nothing here
asserts a speed or a saving (at this size activations are noise next to the interpreter): only
that both rows ran and the table is complete and consistent."""

from __future__ import annotations

import re

import pytest
from harness.launch import run_benchmark

pytestmark = pytest.mark.bench  # the benchmark smoke tests: `pytest -m bench`

ROW = re.compile(
    r"^\| ZeRO-2 \| (off|on) \| ([\d,]+) \| [\d,]+ \| ([\d.]+) \| ([\d.]+) GiB \| "
    r"([+-][\d.]+) GiB \| ([\d,]+) MiB \|$",
    re.M,
)


@pytest.mark.slow
def test_activation_checkpointing_benchmark_prints_both_rows(shakespeare_dir, tmp_path):
    proc = run_benchmark(
        "activation_checkpointing",
        "--model", "gpt2-tiny",
        "--stages", "2",
        "--block_size", "32",
        "--micro_batch_size", "2",
        "--steps", "3",
        "--warmup", "1",
        data_dir=shakespeare_dir,
        work_dir=tmp_path,
    )  # fmt: skip
    rows = ROW.findall(proc.stdout)
    assert [r[0] for r in rows] == ["off", "on"], proc.stdout
    for _, tps, ratio, peak, _, _ in rows:
        assert int(tps.replace(",", "")) > 0 and float(ratio) > 0 and float(peak) > 0.1
    (_, _, ratio_off, peak_off, delta_off, kept_off), (_, _, _, peak_on, delta_on, kept_on) = rows
    assert ratio_off == "1.00" and delta_off in ("+0.00", "-0.00")
    assert float(delta_on) == pytest.approx(float(peak_on) - float(peak_off), abs=0.011)
    assert int(kept_on.replace(",", "")) < int(kept_off.replace(",", ""))  # predicted
