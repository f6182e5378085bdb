"""Broken inputs a user can hand the trainer, and the error each one gets.

Every case runs the real entry point (`python gpt_ds/train.py ...`, one process) or the real
tool, and asserts its exit code and that no traceback was printed; for the trainer, that it
failed during validation (before the process group, before any model). Of the message, it
asserts what it names: the file, flag or field at fault and the facts a user acts on (the
values that differ, the command that fixes it), not its sentences (helpers/messages.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from harness.launch import run_python, train_fails
from helpers.messages import assert_names, names
from support.launch import REPO, TRAIN, VENV_BIN, launch_env, tiny_run_args

SMALL = {"n_layer": 2, "n_head": 2, "n_embd": 64}


@pytest.fixture
def data(shakespeare_dir, tmp_path) -> Path:
    """A private copy of the prepared dataset, to break."""
    copy = tmp_path / "data"
    shutil.copytree(shakespeare_dir, copy)
    return copy


def test_truncated_train_bin(data, tmp_path):
    with (data / "train.bin").open("r+b") as f:
        f.truncate(1000)  # a copy that stopped short
    err = train_fails(tiny_run_args(data, tmp_path / "out"))
    assert_names(
        err,
        f"{data}/train.bin",
        "1000",  # bytes, against meta.json's 301966 tokens (603932 bytes)
        "meta.json",
        "301966",
        "603932",
        f"python tools/prepare_data.py --out_dir {data}",
    )


def test_fix_hint_rebuilds_a_custom_dataset_from_its_own_inputs(shakespeare_dir, tmp_path):
    """The hint after a broken custom dataset names its --input and --val_fraction (run
    literally, the old hint replaced the dataset with Tiny Shakespeare)."""
    corpus = tmp_path / "my corpus"
    corpus.mkdir()
    text = (shakespeare_dir / "meta.json").read_text()  # any text will do
    (corpus / "a.txt").write_text(text * 20)
    (corpus / "b.txt").write_text(text[::-1] * 20)
    data = tmp_path / "mine"
    tool = str(REPO / "tools" / "prepare_data.py")
    args = ["--input", str(corpus), "--out_dir", str(data), "--val_fraction", "0.25"]
    run_python([tool, *args, "--block_size", "64", "--quiet"])
    with (data / "val.bin").open("r+b") as f:
        f.truncate(10)
    err = train_fails(tiny_run_args(data, tmp_path / "out"))
    quoted = [f"'{corpus / name}'" for name in ("a.txt", "b.txt")]
    fix = (
        f"python tools/prepare_data.py --out_dir {data} "
        f"--input {' '.join(quoted)} --val_fraction 0.25"
    )
    assert_names(err, f"{data}/val.bin", fix)
    (data / "meta.json").unlink()  # without it the folder would be read as nanoGPT's
    (data / "train.bin").unlink()
    err = train_fails(tiny_run_args(data, tmp_path / "out"))
    # the inputs are unknown without meta.json: the command asks for them
    fix = f"python tools/prepare_data.py --out_dir {data} --input"
    assert_names(err, f"--data_dir {data}", "train.bin", "meta.json", fix)
    assert not names(err, "val.bin")  # it is there


def test_corrupt_train_bin(data, tmp_path):
    size = (data / "train.bin").stat().st_size
    (data / "train.bin").write_bytes(b"\xff" * size)  # right size, garbage contents
    err = train_fails(tiny_run_args(data, tmp_path / "out"))
    assert_names(err, f"{data}/train.bin", "65535", "position 0", "50257")  # id, where, vocab


def test_token_id_beyond_the_vocabulary(data, tmp_path):
    tokens = np.memmap(data / "val.bin", dtype=np.uint16, mode="r+")
    tokens[1234] = 60000
    tokens.flush()
    del tokens
    err = train_fails(tiny_run_args(data, tmp_path / "out"))
    assert_names(err, f"{data}/val.bin", "60000", "1234", "50257")  # id, position, vocabulary


def test_meta_json_from_another_tokenizer(data, tmp_path):
    meta = json.loads((data / "meta.json").read_text())
    meta["tokenizer_sha256"]["vocab.bpe"] = "0" * 64
    (data / "meta.json").write_text(json.dumps(meta))
    err = train_fails(tiny_run_args(data, tmp_path / "out"))
    # the file, the fingerprint that differs, the fix
    fix = f"python tools/prepare_data.py --out_dir {data}"
    assert_names(err, f"{data}/meta.json", "tokenizer", "0" * 64, fix)


def test_meta_json_that_does_not_parse(data, tmp_path):
    (data / "meta.json").write_text('{"format": "gpt_ds.tokens",')
    err = train_fails(tiny_run_args(data, tmp_path / "out"))
    assert_names(err, f"{data}/meta.json", "Expecting")  # json's own diagnosis


def test_missing_data_dir(tmp_path):
    missing = tmp_path / "nowhere"
    err = train_fails(tiny_run_args(missing, tmp_path / "out"))
    fix = f"python tools/prepare_data.py --out_dir {missing}"
    assert_names(err, f"--data_dir {missing}", "train.bin", "val.bin", fix)


def test_deepspeed_config_that_does_not_parse(shakespeare_dir, tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": 2,}\n')
    err = train_fails(tiny_run_args(shakespeare_dir, tmp_path / "out", deepspeed_config=bad))
    assert_names(err, f"{bad}:3:36", "JSON")


def test_out_dir_that_is_not_writable(shakespeare_dir, tmp_path):
    """A path under a regular file (root ignores chmod, so permissions cannot show this)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    out = blocker / "out"
    err = train_fails(tiny_run_args(shakespeare_dir, out))
    assert_names(err, f"--out_dir {out}", "Not a directory")  # the flag, the OS's reason


def test_resume_with_no_checkpoint(shakespeare_dir, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    err = train_fails(tiny_run_args(shakespeare_dir, out, resume=True))
    assert_names(err, "--resume", str(out), "*/gpt_ds.json")  # the flag, where, what it looked for


# ---------------------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def checkpointed(shakespeare_dir, tmp_path_factory) -> Path:
    """A real one-iteration run of the 2-layer model: its out_dir holds `final`."""
    out = tmp_path_factory.mktemp("ckpt") / "out"
    args = tiny_run_args(
        shakespeare_dir, out, **SMALL, max_iters=1, warmup_iters=0, eval_interval=0, eval_iters=1
    )
    run_python([str(TRAIN), *args], timeout=300)
    assert (out / "final" / "gpt_ds.json").is_file()
    return out


@pytest.mark.slow
def test_resume_with_a_different_model_size(checkpointed, shakespeare_dir, tmp_path):
    run = shutil.copytree(checkpointed, tmp_path / "out")
    args = tiny_run_args(shakespeare_dir, run, **{**SMALL, "n_layer": 3}, resume=True)
    err = train_fails(args)
    assert_names(
        err,
        f"{run}/final",
        "n_layer",
        "checkpoint 2",  # each value with the side it is on
        "run 3",
        "--n_layer",  # the flag to match, or a new run from the weights:
        f"--init_from {run}:final --out_dir NEW_DIR",
    )


@pytest.mark.slow
def test_resume_tag_that_does_not_exist(checkpointed, shakespeare_dir, tmp_path):
    run = shutil.copytree(checkpointed, tmp_path / "out")
    (run / "iter_5.partial").mkdir()  # staging leftovers are not checkpoints either
    err = train_fails(tiny_run_args(shakespeare_dir, run, **SMALL, resume="iter_5"))
    assert_names(err, "--resume iter_5", str(run), "final")  # the tags there are
    assert not names(err, "iter_5.partial")  # not one of them


# ---------------------------------------------------------------------------- hostfiles
BAD_HOSTFILE = "localhost slots=2\nworker-2 slots 4\n"


def test_hostfile_with_a_bad_line_preflight(tmp_path):
    """gpt_ds's own parser (tools/preflight.py): every bad line, with its number and a fix."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(BAD_HOSTFILE)
    proc = run_python(
        [str(REPO / "tools" / "preflight.py"), "--hostfile", str(hostfile)], check=False
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # the file, the line (its number and text), the form it must have
    assert_names(proc.stderr, str(hostfile), "line 2", "worker-2 slots 4", "slots=N")
    assert "Traceback" not in proc.stderr


def test_hostfile_with_a_bad_line_deepspeed(shakespeare_dir, tmp_path):
    """`deepspeed --hostfile` itself: refuses before launching anything (with a traceback)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(BAD_HOSTFILE)
    cmd = [str(VENV_BIN / "deepspeed"), "--hostfile", str(hostfile), str(TRAIN)]
    cmd += tiny_run_args(shakespeare_dir, tmp_path / "out")
    proc = subprocess.run(
        cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert_names(proc.stderr, "ValueError", "worker-2 slots 4")  # DeepSpeed's error, the entry
    assert not (tmp_path / "out").exists()
