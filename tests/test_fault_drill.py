"""The requeue drill (benchmarks/fault_drill.py) at its test size: three SIGKILLs of every
process of one job, each launch the same `--resume auto --save_every_minutes` command, the first
kill before any checkpoint exists; the job must finish bit-identical to an uninterrupted run
(weights and every logged number), with no launch refused and no checkpoint lost."""

from __future__ import annotations

import re

import pytest
from harness.launch import run_benchmark

pytestmark = pytest.mark.bench  # a benchmark's smoke test: `pytest -m bench`


@pytest.mark.slow
def test_a_job_killed_three_times_ends_bit_identical_to_an_uninterrupted_run(
    shakespeare_dir, tmp_path
):
    flags = ("--kills", "3", "--seed", "1", "--max_iters", "12")  # each a real deepspeed launch
    proc = run_benchmark(
        "fault_drill", *flags, data_dir=shakespeare_dir, work_dir=tmp_path, timeout=1500
    )
    out = proc.stdout
    rows = out.split("| kills |")[0]
    launches = re.findall(r"^\| (\d+) +\| (\S+(?: iter_\d+)?) +\| (\S+) +\|", rows, re.M)
    assert [int(n) for n, _, _ in launches] == list(range(1, 5)), out
    kinds = [killed for _, _, killed in launches]
    assert set(kinds[:3]) <= {"start-up", "train", "save"} and kinds[3] == "no", out
    # the first kill lands before any checkpoint (killed at start-up it may not have said how
    # it started): the next launch starts the run afresh, or anew when nothing was written
    assert launches[0][1] in ("new", "-") and launches[1][1] in ("afresh", "new", "-"), out
    summary = out.split("| kills |")[1].splitlines()[2]
    kills, _, _, refused, lost, *_, identical = (c.strip() for c in summary.strip("| ").split("|"))
    assert (kills, refused, lost, identical) == ("3", "0", "0", "yes"), out
    assert proc.returncode == 0
