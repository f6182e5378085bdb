"""gpt_ds.launch.burn_in's judging (pure); the real launches are tests/test_preflight.py's."""

from __future__ import annotations

from gpt_ds.launch.burn_in import slow_flags


def test_below_half_the_median_of_the_others_is_flagged_with_three_or_more():
    tflops = {"127.0.0.1": 1.1, "127.0.0.2": 1.0, "127.0.0.3": 0.3, "127.0.0.4": 1.2}
    assert slow_flags(tflops, "matmul", "TFLOP/s", "check its clocks") == [
        "127.0.0.3: matmul 0.3 TFLOP/s vs median 1.1: check its clocks"
    ]
    assert slow_flags({"a": 1.0, "b": 0.6, "c": 1.0}, "link", "GB/s", "x") == []  # 0.6 >= 0.5
    assert slow_flags({"a": 1.0, "b": 0.1}, "matmul", "TFLOP/s", "x") == []  # two: no median


def test_a_uniformly_slow_set_flags_nothing():
    assert slow_flags({f"h{i}": 0.01 for i in range(5)}, "matmul", "TFLOP/s", "x") == []
