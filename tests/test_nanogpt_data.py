"""A folder written by nanoGPT's prepare.py (uint16 train.bin/val.bin, no meta.json) trains,
evaluates, checkpoints and resumes as it is; a meta.pkl of another vocabulary, a meta.pkl that
would run code, ids beyond GPT-2's vocabulary and an odd-sized file are refused clearly."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from harness.launch import run_deepspeed
from helpers.compared_runs import BASE, ITERS, assert_losses_close
from helpers.logged import train_losses, val_losses
from support.launch import tiny_run_args

from gpt_ds.base.errors import DataError
from gpt_ds.data.tokenizer import DEFAULT_CORPUS, VOCAB_SIZE, get_encoding
from gpt_ds.data.tokens import load_token_data

WHOLE = {"micro_batch_size": 8, "grad_accum": 1, "eval_iters": 2}  # test_grad_accum's baseline


def nanogpt_prepare(out: Path, text: str) -> Path:
    """nanoGPT's data/shakespeare/prepare.py, step for step: 90/10 by characters, GPT-2 BPE
    `encode_ordinary`, `np.array(ids, dtype=np.uint16).tofile(...)`; no meta.json."""
    out.mkdir(parents=True)
    n = len(text)
    enc = get_encoding()
    for name, part in (("train", text[: int(n * 0.9)]), ("val", text[int(n * 0.9) :])):
        np.array(enc.encode_ordinary(part), dtype=np.uint16).tofile(out / f"{name}.bin")
    return out


def char_level_folder(out: Path, text: str) -> Path:
    """nanoGPT's data/shakespeare_char/prepare.py: character ids and a meta.pkl."""
    out.mkdir(parents=True)
    chars = sorted(set(text))
    stoi, itos = {ch: i for i, ch in enumerate(chars)}, dict(enumerate(chars))
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    ids[: len(ids) * 9 // 10].tofile(out / "train.bin")
    ids[len(ids) * 9 // 10 :].tofile(out / "val.bin")
    with open(out / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    return out


@pytest.mark.slow
def test_nanogpt_folder_trains_and_resumes(shakespeare_dir, runs, tmp_path):
    """The same bytes as the prepared Tiny Shakespeare, so the same losses as test_grad_accum's
    baseline run, before and after a resume from iter_2."""
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    nano = nanogpt_prepare(tmp_path / "nanogpt", text)
    for name in ("train.bin", "val.bin"):
        assert (nano / name).read_bytes() == (shakespeare_dir / name).read_bytes()
    args = {**BASE, **WHOLE, "deepspeed_config": "ds_configs/zero2.json"}
    out = tmp_path / "out"
    stdout = run_deepspeed(tiny_run_args(nano, out, **args)).stdout
    assert f"data: {nano} has no gpt_ds meta.json: read as nanoGPT uint16" in stdout
    baseline = runs(2, **WHOLE)
    assert_losses_close(out, baseline, rel=0.0)
    assert val_losses(out) == val_losses(baseline) and sorted(val_losses(out)) == [2, ITERS]

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "iter_2", resumed / "iter_2")
    run_deepspeed(tiny_run_args(nano, resumed, **args, resume="iter_2"))
    after = train_losses(resumed)
    assert sorted(after) == [3, 4]
    assert after == {it: loss for it, loss in train_losses(baseline).items() if it > 2}


def test_meta_pkl_of_another_vocabulary_is_refused(tmp_path):
    text = DEFAULT_CORPUS.read_text()
    folder = char_level_folder(tmp_path / "shakespeare_char", text)
    with pytest.raises(DataError) as caught:
        load_token_data(folder, VOCAB_SIZE, 64)
    assert len(set(text)) == 65  # nanoGPT's figure
    assert str(caught.value) == (
        f"{folder}/meta.pkl: vocab_size 65, a character-level vocabulary (nanoGPT's "
        f"shakespeare_char writes such), not GPT-2's {VOCAB_SIZE}: its ids are not GPT-2 "
        "tokens, and GPT-2's tokenizer cannot train on them. Re-prepare the text with: "
        f"python tools/prepare_data.py --input YOUR_TEXT --out_dir {folder}_gpt2"
    )


class _Payload:
    """A pickle that creates a file when loaded the usual way."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def test_meta_pkl_is_read_without_running_code(tmp_path):
    folder = nanogpt_prepare(tmp_path / "data", DEFAULT_CORPUS.read_text()[:20_000])
    sentinel = tmp_path / "pwned"
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": _Payload(sentinel)}))
    with pytest.raises(DataError, match=r"meta\.pkl: not a nanoGPT meta\.pkl of plain data \("):
        load_token_data(folder, VOCAB_SIZE, 64)
    assert not sentinel.exists()


def test_nanogpt_folder_checks(tmp_path, capsys):
    """GPT-2's own vocab_size in meta.pkl passes; every id is checked; odd sizes are refused."""
    folder = nanogpt_prepare(tmp_path / "data", DEFAULT_CORPUS.read_text()[:20_000])
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": VOCAB_SIZE}))
    data = load_token_data(folder, VOCAB_SIZE, 64)
    assert data.train.tobytes() == (folder / "train.bin").read_bytes()
    assert capsys.readouterr().out == (
        f"data: {folder} has no gpt_ds meta.json: read as nanoGPT uint16 train.bin/val.bin "
        "(GPT-2 BPE ids)\n"
    )
    ids = np.fromfile(folder / "val.bin", dtype=np.uint16)
    ids[-1] = 60000  # the very last id is checked too
    ids.tofile(folder / "val.bin")
    with pytest.raises(DataError, match=rf"val\.bin: token id 60000 at position {len(ids) - 1} "):
        load_token_data(folder, VOCAB_SIZE, 64)
    with open(folder / "train.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(DataError, match=r"train\.bin: \d+ bytes, an odd number: not whole uint16"):
        load_token_data(folder, VOCAB_SIZE, 64)
