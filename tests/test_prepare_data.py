"""Data preparation: the published Tiny Shakespeare counts, chunked == one-shot encoding,
JSONL and folder inputs, every error naming its file, atomic output, and the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt_ds.base.errors import DataError
from gpt_ds.data.prepare import inputs as prepare
from gpt_ds.data.prepare.inputs import iter_safe_chunks
from gpt_ds.data.prepare.pipeline import prepare_dataset
from gpt_ds.data.tokenizer import (
    DEFAULT_CORPUS,
    EOT_TOKEN,
    VOCAB_SIZE,
    get_encoding,
    tokenizer_fingerprint,
)
from gpt_ds.data.tokens import load_token_data

REPO = Path(__file__).resolve().parents[1]
TRICKY = (
    "Hello  world\n\n  \n\tx  \r\n don't 'S I'll we've 123 4567 3.14 😀😀 👩‍👩‍👧 日本語 "
    "Привет é e\u0301 \u00a0a \u2028b \x1cc \u3000d ... !!  ?\n   \t\nword\nword word  \n"
    "<|endoftext|> x\n \n"
)


# --------------------------------------------------------------------------- reference


def encode(text: str) -> list[int]:
    return get_encoding().encode_ordinary(text)


def join_documents(pieces: list[str]) -> list[int]:
    """One-shot reference: each non-empty piece encoded alone, EOT between them."""
    tokens: list[int] = []
    for piece in pieces:
        if piece:
            tokens += ([EOT_TOKEN] if tokens else []) + encode(piece)
    return tokens


def reference(spec: list[tuple[str, object]], f: float = 0.1) -> tuple[list[int], list[int]]:
    """The documented split rule, written plainly: text split by characters, JSONL documents
    counted over all JSONL inputs and held out whole when floor((i+1)f) > floor(if)."""
    train, val, i = [], [], 0
    for kind, content in spec:
        if kind == "text":
            k = int(len(content) * (1 - f))
            train.append(content[:k])
            val.append(content[k:])
            continue
        for doc in content:
            if doc:
                held_out = math.floor((i + 1) * f) > math.floor(i * f)
                (val if held_out else train).append(doc)
                i += 1
    return join_documents(train), join_documents(val)


def read_bin(path: Path) -> list[int]:
    return np.memmap(path, dtype=np.uint16, mode="r").tolist()


def assert_clean(out_dir: Path) -> None:
    """No temporary file left behind."""
    if out_dir.exists():
        assert [p.name for p in out_dir.iterdir() if p.name.endswith(".tmp")] == []


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


def run(inputs, out_dir: Path, **kwargs) -> dict:
    kwargs = {"num_workers": 0, "min_val_tokens": 1, "progress": False} | kwargs
    return prepare_dataset(inputs, out_dir, **kwargs)


# --------------------------------------------------------------------------- known answer


def test_known_answer_tiny_shakespeare(tmp_path):
    out = tmp_path / "shakespeare"
    meta = prepare_dataset(None, out, num_workers=0, progress=False)
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    n = len(text)
    train, val = encode(text[: int(n * 0.9)]), encode(text[int(n * 0.9) :])
    # the figures nanoGPT publishes for this file
    assert (meta["train_tokens"], meta["val_tokens"]) == (301_966, 36_059)
    assert (len(train), len(val)) == (301_966, 36_059)
    assert read_bin(out / "train.bin") == train and read_bin(out / "val.bin") == val
    assert (out / "train.bin").stat().st_size == 2 * 301_966
    on_disk = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert on_disk == meta
    expected = {
        "format": "gpt_ds.tokens",
        "version": 1,
        "dtype": "uint16",
        "tokenizer": "gpt2",
        "tokenizer_sha256": tokenizer_fingerprint(),
        "vocab_size": 50257,
        "eot_token": 50256,
        "val_fraction": 0.1,
        "documents": 1,
    }
    assert {k: meta[k] for k in expected} == expected
    assert meta["sources"] == [
        {
            "path": str(DEFAULT_CORPUS),
            "sha256": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
            "bytes": 1_115_394,
            "documents": 1,
        }
    ]
    assert meta["created"].endswith("+00:00")
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_chunked_parallel_equals_one_shot(tmp_path):
    """Small chunks, two worker processes, streaming reads: the same bytes as one-shot."""
    meta = run([DEFAULT_CORPUS], tmp_path / "par", num_workers=2, chunk_chars=40_000)
    run([DEFAULT_CORPUS], tmp_path / "one", num_workers=0)
    assert (meta["train_tokens"], meta["val_tokens"]) == (301_966, 36_059)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "par" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()


@pytest.mark.parametrize("chunk_chars", [1, 2, 7, 64, 1000])
def test_safe_chunks_do_not_change_tokens(chunk_chars):
    text = TRICKY * 20 + DEFAULT_CORPUS.read_text(encoding="utf-8")[:20_000]
    chunks = list(iter_safe_chunks(text, chunk_chars))
    assert "".join(chunks) == text
    assert len(chunks) > len(text) // (chunk_chars * 100 + 1000)
    assert [t for c in chunks for t in encode(c)] == encode(text)


def test_text_file_streamed_in_small_blocks(tmp_path):
    """BOM dropped, CRLF and CR become LF (as Python's text mode does), blocks of 50 chars."""
    raw = "\ufeff" + (TRICKY + "line\r\nnext\rlast\r\n") * 30
    path = tmp_path / "tricky.txt"
    path.write_bytes(raw.encode("utf-8"))
    meta = run([path], tmp_path / "out", chunk_chars=50)
    text = raw[1:].replace("\r\n", "\n").replace("\r", "\n")
    train, val = reference([("text", text)])
    assert read_bin(tmp_path / "out" / "train.bin") == train
    assert read_bin(tmp_path / "out" / "val.bin") == val
    assert meta["sources"][0]["bytes"] == len(raw.encode("utf-8"))


# --------------------------------------------------------------------------- JSONL, folders


def test_jsonl_documents_eot_and_split(tmp_path):
    docs = [f"Document number {i}.\nIt has two lines." for i in range(25)]
    docs[3] = "contains <|endoftext|> as plain text"
    docs[4] = "a lone surrogate \ud800 is replaced"
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)]
    lines.insert(5, "")  # blank lines are skipped
    lines.insert(7, json.dumps({"text": ""}))  # empty documents too
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    meta = run([path], tmp_path / "out", chunk_chars=16)
    train, val = reference([("jsonl", docs)])
    assert read_bin(tmp_path / "out" / "train.bin") == train
    assert read_bin(tmp_path / "out" / "val.bin") == val
    assert val == encode(docs[9]) + [EOT_TOKEN] + encode(docs[19])  # every 10th document
    assert train.count(EOT_TOKEN) == 22  # between 23 documents, none at the ends
    assert meta["documents"] == 25 and meta["sources"][0]["documents"] == 25


def test_folder_inputs(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "a").mkdir(parents=True)
    (corpus / ".git").mkdir()
    files = {
        "b.txt": "The second file, plain text.\n" * 5,
        "a/z.md": "# Markdown\n\nA nested file in a sub-folder.\n" * 4,
        "UPPER.TXT": "Upper-case suffixes count too.\n" * 6,
    }
    for rel, text in files.items():
        (corpus / rel).write_text(text, encoding="utf-8")
    docs = [f"json doc {i}" for i in range(12)]
    write_jsonl(corpus / "docs.jsonl", docs)
    for ignored in ("a/.hidden.txt", ".git/HEAD.txt", "tokens.bin", "notes.json"):
        (corpus / ignored).write_text("IGNORED", encoding="utf-8")

    # the folder plus a file inside it: read once
    meta = run([corpus, corpus / "b.txt"], tmp_path / "out")
    order = ["UPPER.TXT", "a/z.md", "b.txt", "docs.jsonl"]  # sorted relative paths
    assert [s["path"] for s in meta["sources"]] == [str(corpus / p) for p in order]
    assert [s["documents"] for s in meta["sources"]] == [1, 1, 1, 12]
    spec = [("text", files[p]) for p in order[:3]] + [("jsonl", docs)]
    train, val = reference(spec)
    assert read_bin(tmp_path / "out" / "train.bin") == train
    assert read_bin(tmp_path / "out" / "val.bin") == val
    assert val.count(EOT_TOKEN) == 3  # 3 text tails + json doc 9
    assert meta["documents"] == 15


# --------------------------------------------------------------------------- errors


def _error_cases(tmp: Path) -> dict:
    (tmp / "empty_dir").mkdir()
    (tmp / "latin1.txt").write_bytes(b"hello \xe9t\xe9\n")
    (tmp / "empty.txt").write_bytes(b"")
    (tmp / "small.txt").write_text("hello world " * 50, encoding="utf-8")
    (tmp / "bad.jsonl").write_text('{"text": "ok"}\n{"text": "unterminated\n', encoding="utf-8")
    (tmp / "notext.jsonl").write_text('{"body": "no text field"}\n', encoding="utf-8")
    (tmp / "nonstr.jsonl").write_text('{"text": 42}\n', encoding="utf-8")
    (tmp / "badbytes.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    (tmp / "a_file").write_text("not a folder", encoding="utf-8")
    return {  # name: (inputs, out_dir, extra kwargs, regex the message must match)
        "missing": ([tmp / "nope.txt"], None, {}, r"nope\.txt does not exist"),
        "empty folder": ([tmp / "empty_dir"], None, {}, r"empty_dir holds no input files"),
        "not utf-8": ([tmp / "latin1.txt"], None, {}, r"latin1\.txt is not valid UTF-8.*offset 6"),
        "bad json": ([tmp / "bad.jsonl"], None, {}, r"bad\.jsonl:2: invalid JSON"),
        "no text": ([tmp / "notext.jsonl"], None, {}, r'notext\.jsonl:1: .*"text" field'),
        "non-string": ([tmp / "nonstr.jsonl"], None, {}, r"nonstr\.jsonl:1: .*string, got int"),
        "jsonl bytes": ([tmp / "badbytes.jsonl"], None, {}, r"badbytes\.jsonl:2: not valid UTF-8"),
        "empty": ([tmp / "empty.txt"], None, {}, r"input is empty \(.*empty\.txt\)"),
        "val too small": (
            [tmp / "small.txt"],
            None,
            {"min_val_tokens": 1025},
            r"fewer than the 1,025 .*small\.txt.*--val_fraction",
        ),
        "out_dir": ([tmp / "small.txt"], tmp / "a_file" / "out", {}, r"a_file/out"),
        "fraction 0": ([tmp / "small.txt"], None, {"val_fraction": 0.0}, r"val_fraction"),
        "fraction 1": ([tmp / "small.txt"], None, {"val_fraction": 1.0}, r"val_fraction"),
        "fraction >1": ([tmp / "small.txt"], None, {"val_fraction": 1.5}, r"val_fraction"),
    }


def test_errors_name_the_file(tmp_path):
    for name, (inputs, out_dir, kwargs, pattern) in _error_cases(tmp_path).items():
        out_dir = out_dir or tmp_path / f"out_{name.replace(' ', '_')}"
        with pytest.raises(DataError, match=pattern):
            run(inputs, out_dir, **kwargs)
        assert not (out_dir / "meta.json").exists(), name
        assert_clean(out_dir)


def test_unreadable_file(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret", encoding="utf-8")

    def guarded_open(path, *args, **kwargs):  # chmod 000 does not stop root: simulate it
        if Path(path) == secret:
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(prepare, "open", guarded_open, raising=False)
    with pytest.raises(DataError, match=r"cannot read input file .*secret\.txt: Permission denied"):
        run([secret], tmp_path / "out")


def test_failed_run_keeps_previous_dataset(tmp_path):
    out = tmp_path / "out"
    good = tmp_path / "good.txt"
    good.write_text("Some good text.\n" * 200, encoding="utf-8")
    run([good], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (tmp_path / "late.jsonl").write_text('{"text": "fine"}\nnot json\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"late\.jsonl:2"):
        run([good, tmp_path / "late.jsonl"], out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_temporaries_of_killed_runs_are_removed(tmp_path):
    """A SIGKILLed prepare_data leaves `.train.bin.PID.tmp`; the next run into the same folder
    removes it, but never a temporary of a process that is still running."""
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process now
    stale = [out / f".train.bin.{dead.pid}.tmp", out / f".meta.json.{dead.pid}.tmp"]
    live = out / f".val.bin.{os.getppid()}.tmp"
    for path in [*stale, live]:
        path.write_bytes(b"half written")
    good = tmp_path / "good.txt"
    good.write_text("Some good text.\n" * 200, encoding="utf-8")
    run([good], out)
    assert [p.exists() for p in stale] == [False, False] and live.exists()
    assert (out / "train.bin").is_file()


def test_interrupted_commit_never_looks_complete(tmp_path, monkeypatch):
    out = tmp_path / "out"
    run([DEFAULT_CORPUS], out)
    real_replace, calls = os.replace, []

    def crash_after_first(src, dst):
        calls.append(dst)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(prepare.os, "replace", crash_after_first)
    with pytest.raises(DataError, match="No space left"):
        run([DEFAULT_CORPUS], out, val_fraction=0.2)
    assert not (out / "meta.json").exists()  # train.bin is new, val.bin old: no meta
    assert_clean(out)
    # not read as a nanoGPT folder (which has no meta.json either); the hint is the new run's
    hint = r"interrupted python tools/prepare_data\.py left it .* 0\.2$"
    with pytest.raises(DataError, match=hint):
        load_token_data(out, VOCAB_SIZE, 64)
    monkeypatch.undo()  # a run that completes removes the marker
    run([DEFAULT_CORPUS], out)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


# --------------------------------------------------------------------------- CLI


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "tools/prepare_data.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_end_to_end(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("To be, or not to be, that is the question.\n" * 100, encoding="utf-8")
    out = tmp_path / "data"
    done = cli("--input", str(src), "--out_dir", str(out), "--block_size", "32", "--quiet")
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert f"{meta['train_tokens']:,}" in done.stdout and "tokens/s" in done.stdout
    assert meta["val_tokens"] >= 33

    missing = cli("--input", str(tmp_path / "missing.txt"), "--out_dir", str(out))
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ") and "missing.txt" in missing.stderr

    too_small = cli("--input", str(src), "--out_dir", str(out), "--block_size", "4096")
    assert too_small.returncode == 2 and "--val_fraction" in too_small.stderr
    assert json.loads((out / "meta.json").read_text(encoding="utf-8")) == meta  # untouched
