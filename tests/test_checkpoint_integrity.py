"""Damaged checkpoints are found before anything loads them: checksums in the manifest, checked
by `--resume` (spread over the ranks), by export and by tools/verify_checkpoint.py.

The checkpoints are the session's real 2-rank runs (conftest.stage_run: tags iter_10, iter_20,
final), copied file by file before any byte is changed. The reference for a checksum is
`sha256sum`, for a resume the uninterrupted run's own logged losses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from harness.launch import STAGE_RUN_ITERS, run_deepspeed, run_python
from helpers.logged import train_losses
from helpers.messages import assert_names
from support.launch import REPO, tiny_run_args

pytestmark = pytest.mark.slow

VERIFY = REPO / "tools" / "verify_checkpoint.py"
EXPORT = REPO / "tools" / "zero_to_fp32.py"
# every kind of file a ZeRO-2 checkpoint holds: weights, a rank's optimizer shard, a rank's
# RNG and training-window state
FILE_KINDS = [
    "mp_rank_00_model_states.pt",
    "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    "gpt_ds_rank0.pt",
]


def copied_run(src: Path, dst: Path) -> Path:
    """A real copy (never hard links: the bytes are about to be damaged)."""
    shutil.copytree(src, dst)
    return dst


def overwrite_middle(path: Path, nbytes: int = 4096) -> None:
    """Same size, other content: `nbytes` random bytes in the middle of the file."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(max(0, size // 2 - nbytes // 2))
        f.write(os.urandom(min(nbytes, size)))
    assert path.stat().st_size == size


def truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("stage", [2, 3])
def test_every_file_has_its_sha256_in_the_manifest(stage, stage_run):
    out, _ = stage_run(stage)
    for tag in ("iter_10", "final"):
        manifest = json.loads((out / tag / "gpt_ds.json").read_text())
        assert manifest["checksum_algorithm"] == "sha256"
        assert manifest["checksums"].keys() == manifest["files"].keys()
        names = sorted(manifest["files"])
        proc = subprocess.run(
            ["sha256sum", *names], cwd=out / tag, capture_output=True, text=True, check=True
        )
        expected = dict(reversed(line.split("  ", 1)) for line in proc.stdout.splitlines())
        assert manifest["checksums"] == expected
        # every rank's files are listed, the ZeRO-3 per-rank weight shards included
        assert {"gpt_ds_rank0.pt", "gpt_ds_rank1.pt"} <= set(names)
        assert len([n for n in names if "optim_states" in n]) == 2


def verify(*args: str) -> subprocess.CompletedProcess:
    return run_python([str(VERIFY), *args], check=False)


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_verify_tool_names_each_damaged_file(kind, stage_run, tmp_path):
    run = copied_run(stage_run(2)[0], tmp_path / "run")
    ok = verify(str(run))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "| final (latest) | 24 | 5 |" in ok.stdout and "DAMAGED" not in ok.stdout

    size = (run / "iter_20" / kind).stat().st_size
    overwrite_middle(run / "iter_10" / kind)
    truncate(run / "iter_20" / kind)
    bad = verify(str(run))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = bad.stdout.splitlines()
    assert any(line.startswith("| iter_10 | 10 |") and "DAMAGED" in line for line in lines)
    assert any(line.startswith("| iter_20 | 20 |") and "DAMAGED" in line for line in lines)
    assert any(line.startswith("| final (latest) |") and "| ok |" in line for line in lines)
    # each damaged file under its tag: a checksum that differs, a size that differs
    (changed,) = [line for line in lines if f"{run}/iter_10" in line and kind in line]
    assert_names(changed, "sha256")
    (short,) = [line for line in lines if f"{run}/iter_20" in line and kind in line]
    assert_names(short, str(size // 2), str(size))
    assert_names(bad.stdout, "damaged: iter_10, iter_20")

    one = verify(str(run / "final"))  # a tag directory: only that tag
    assert one.returncode == 0 and "iter_10" not in one.stdout
    assert verify(str(run), "--tag", "iter_10").returncode == 1
    missing = verify(str(run), "--tag", "iter_99")
    assert missing.returncode == 2
    assert_names(missing.stderr, "--tag iter_99")


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_export_refuses_a_damaged_tag_and_names_the_file(kind, stage_run, tmp_path):
    run = copied_run(stage_run(2)[0], tmp_path / "run")
    overwrite_middle(run / "final" / kind)
    output = tmp_path / "hf"
    proc = run_python([str(EXPORT), str(run), "--output", str(output)], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # the tag, the file, and the tags to use instead
    assert_names(proc.stderr, f"{run}/final", kind, "sha256", "iter_10, iter_20, final")
    assert not output.exists()
    ok = run_python([str(EXPORT), str(run), "--tag", "iter_20", "--output", str(output)])
    assert (output / "config.json").is_file(), ok.stdout


def resume(run: Path, data_dir: Path, *more: str) -> subprocess.CompletedProcess:
    """The session's ZeRO-2 run again, resumed: same arguments as conftest.stage_run."""
    args = tiny_run_args(
        data_dir, run, deepspeed_config="ds_configs/zero2.json", max_iters=STAGE_RUN_ITERS
    )
    return run_deepspeed([*args, *more], check=False)


@pytest.mark.parametrize(
    "damage, kind",
    [
        (overwrite_middle, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
        (truncate, "mp_rank_00_model_states.pt"),
    ],
)
def test_resume_refuses_a_damaged_named_tag(damage, kind, stage_run, shakespeare_dir, tmp_path):
    """`--resume final` with one file damaged: exit 2 before any model is built, rank 0 names
    the file once; nothing is written to the run directory."""
    run = copied_run(stage_run(2)[0], tmp_path / "run")
    damage(run / "final" / kind)
    before = sorted(p.name for p in run.iterdir())
    proc = resume(run, shakespeare_dir, "--resume", "final")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = proc.stderr
    assert_names(err, f"{run}/final", kind, "iter_10, iter_20, final")  # and the tags to use
    assert err.count("error:") == 1  # said once, by rank 0
    assert "PytorchStreamReader" not in err + proc.stdout and "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == before
    assert "model gpt2-tiny:" not in proc.stdout  # refused before the start-up report


def test_resume_from_a_damaged_latest_falls_back_and_continues_exactly(
    stage_run, shakespeare_dir, tmp_path
):
    """`--resume` (latest = final, damaged): the newest intact tag iter_20 is used, the log
    says why, and iterations 21-24 equal the uninterrupted run's to the bit."""
    src = stage_run(2)[0]
    run = copied_run(src, tmp_path / "run")
    overwrite_middle(run / "final" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    proc = resume(run, shakespeare_dir, "--resume")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    damaged = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    (why,) = [line for line in out.splitlines() if f"{run}/final" in line and damaged in line]
    assert_names(why, "sha256")  # the tag, the file and what differs, said once
    assert "using the newest complete tag 'iter_20'" in out
    assert "checkpoint: iter_20 verified" in out
    assert f"resumed from {run}/iter_20 at iteration 20" in out
    reference = train_losses(src)
    got = train_losses(run)
    assert [got[i] for i in range(21, 25)] == [reference[i] for i in range(21, 25)]
    assert verify(str(run)).returncode == 0  # `final` was rewritten by the resumed run
