"""The offline GPT-2 encoding: pinned files, constants, and parity with Hugging Face's BPE."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from helpers.messages import assert_names

from gpt_ds.base.errors import DataError
from gpt_ds.data import tokenizer
from gpt_ds.data.tokenizer import (
    DEFAULT_CORPUS,
    EOT_TOKEN,
    TOKENIZER_NAME,
    VOCAB_SIZE,
    assets_dir,
    get_encoding,
    tokenizer_fingerprint,
)

# Pinned in gpt_ds/assets/gpt2/README.md and in tiktoken_ext/openai_public.py.
VOCAB_BPE_SHA = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
SHAKESPEARE_SHA = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

# Whitespace runs, line ends, contractions, digits, non-Latin scripts, emoji, combining marks,
# Unicode spaces (NBSP, ideographic, line separator) and separators Python alone calls spaces.
TRICKY = (
    "Hello  world\n\n  \n\tx  \r\n don't 'S I'll we've 123 4567 3.14 😀😀 👩‍👩‍👧 日本語 "
    "Привет é e\u0301 \u00a0a \u2028b \x1cc \u3000d ... !!  ?\n   \t\n"
    " leading and trailing   "
)


def _hf_tokenizer():
    """transformers' GPT-2 BPE (the Rust `tokenizers` library) from the same packaged files."""
    from transformers import GPT2TokenizerFast

    folder = assets_dir()
    vocab = json.loads((folder / "encoder.json").read_text(encoding="utf-8"))
    lines = (folder / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split()) for line in lines if line]
    return GPT2TokenizerFast(vocab=vocab, merges=merges)


def test_constants():
    enc = get_encoding()
    assert enc is get_encoding()  # cached
    assert (TOKENIZER_NAME, VOCAB_SIZE, EOT_TOKEN) == ("gpt2", 50257, 50256)
    assert enc.n_vocab == VOCAB_SIZE and enc.eot_token == EOT_TOKEN
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN]
    assert enc.encode_ordinary("hello world") == [31373, 995]  # tiktoken's own doc example


def test_fingerprint_and_assets():
    assert tokenizer_fingerprint() == {"vocab.bpe": VOCAB_BPE_SHA, "encoder.json": ENCODER_JSON_SHA}
    assert {p.name for p in assets_dir().iterdir()} >= {"vocab.bpe", "encoder.json"}
    assert hashlib.sha256(DEFAULT_CORPUS.read_bytes()).hexdigest() == SHAKESPEARE_SHA


def test_matches_huggingface_bpe():
    enc, hf = get_encoding(), _hf_tokenizer()
    shakespeare = DEFAULT_CORPUS.read_text(encoding="utf-8")[:5000]
    for text in (shakespeare, TRICKY, TRICKY * 3 + shakespeare[:500]):
        assert enc.encode_ordinary(text) == hf.encode(text)


def test_round_trip():
    enc = get_encoding()
    for text in (DEFAULT_CORPUS.read_text(encoding="utf-8"), TRICKY, "<|endoftext|> as text"):
        assert enc.decode(enc.encode_ordinary(text)) == text


@pytest.fixture
def fake_assets(tmp_path, monkeypatch):
    """A copy of the BPE files that a test may corrupt; the real cached encoding is restored."""
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copy(assets_dir() / name, tmp_path / name)
    monkeypatch.setattr(tokenizer, "assets_dir", lambda: tmp_path)
    get_encoding.cache_clear()
    yield tmp_path
    get_encoding.cache_clear()


def test_corrupt_file_names_the_file(fake_assets):
    with open(fake_assets / "encoder.json", "a", encoding="utf-8") as f:
        f.write(" ")
    with pytest.raises(DataError) as e:
        get_encoding()
    # the file, its digest and the one expected
    actual = hashlib.sha256((fake_assets / "encoder.json").read_bytes()).hexdigest()
    expected = tokenizer.ASSET_SHA256["encoder.json"]
    assert_names(str(e.value), str(fake_assets / "encoder.json"), actual, expected)


def test_missing_file_names_the_file(fake_assets):
    (fake_assets / "vocab.bpe").unlink()
    with pytest.raises(DataError) as e:
        tokenizer_fingerprint()
    assert_names(str(e.value), str(fake_assets / "vocab.bpe"), "pip install -e .")  # and the fix
