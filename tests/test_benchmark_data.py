"""The data-preparation and evaluation benchmarks run at a tiny size, so neither can rot.
Nothing here asserts a speed: only that every row ran, the table is complete, gpt_ds and the
one-shot encoding agree, and 1 and 2 ranks find the same val loss."""

from __future__ import annotations

import re

import pytest
from harness.launch import run_benchmark

pytestmark = pytest.mark.bench  # the benchmark smoke tests: `pytest -m bench`

NUMBER = r"[\d,.]+"


def _rows(stdout: str, names: list[str]) -> dict[str, list[str]]:
    """The markdown rows of `names`, as their cells after the name."""
    found = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in names:
            found[cells[0]] = cells[1:]
    assert list(found) == names, stdout
    return found


def _positive(cell: str) -> float:
    value = float(re.match(NUMBER, cell).group().replace(",", ""))
    assert value > 0, cell
    return value


@pytest.mark.slow
def test_prepare_benchmark_prints_every_row(tmp_path):
    proc = run_benchmark("prepare", "--mb", "1", "--reps", "1", work_dir=tmp_path)
    rows = _rows(
        proc.stdout, ["gpt_ds (tools/prepare_data.py)", "tiktoken encode_ordinary, one core"]
    )
    for tokens, tps, _each, seconds, peak, ratio in rows.values():
        for cell in (tokens, tps, seconds, peak, ratio):
            _positive(cell)
        assert peak.endswith("MiB")
    assert rows["tiktoken encode_ordinary, one core"][-1] == "1.00"  # the reference row
    # one copy of Tiny Shakespeare: the val split cuts a word, so the streams differ there only
    gpt_ds, one_shot = (_positive(r[0]) for r in rows.values())
    assert abs(gpt_ds - one_shot) <= 2, proc.stdout
    assert "same tokens:" in proc.stdout


@pytest.mark.slow
def test_eval_benchmark_ranks_agree(shakespeare_dir, tmp_path):
    proc = run_benchmark(
        "eval", "--block_size", "64", "--micro_batch_size", "2", "--eval_iters", "3",
        "--reps", "1", data_dir=shakespeare_dir, work_dir=tmp_path,
    )  # fmt: skip
    rows = _rows(proc.stdout, ["1 rank", "2 ranks", "1 rank, 2 threads"])
    losses = []
    for tokens, seconds, tps, _each, ratio, loss, diff in rows.values():
        assert _positive(tokens) == 3 * 2 * 64
        for cell in (seconds, tps, ratio):
            _positive(cell)
        losses.append(_positive(loss))
        assert abs(float(diff)) < 1e-5, proc.stdout
    assert max(losses) - min(losses) < 1e-5 and 9 < losses[0] < 12  # untrained: ~ln(50257)
