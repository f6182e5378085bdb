"""GPT-2 byte-pair encoding, built offline from the files packaged in ``gpt_ds/assets/gpt2``.

``tiktoken.get_encoding("gpt2")`` downloads ``vocab.bpe`` and ``encoder.json`` at run time,
which fails on an offline cluster node. The same two files ship inside the package; they are
checked against the SHA-256 digests tiktoken itself pins, then turned into the identical
encoding (same ranks, same regex, same ``<|endoftext|>`` = 50256 special token).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import tiktoken
import tiktoken.load

from gpt_ds.base.errors import DataError

TOKENIZER_NAME = "gpt2"
VOCAB_SIZE = 50257
EOT_TOKEN = 50256
EOT_TEXT = "<|endoftext|>"

# The digests tiktoken_ext/openai_public.py pins for the official GPT-2 files.
ASSET_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}

# The gpt2 (r50k) pre-tokenisation pattern, copied from tiktoken_ext/openai_public.py. It is
# equivalent to the original GPT-2 release's pattern, but faster.
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)

_ASSETS = Path(__file__).resolve().parents[1] / "assets"

# The embedded default corpus: Tiny Shakespeare (1,115,394 characters, public domain).
DEFAULT_CORPUS = _ASSETS / "tinyshakespeare.txt"


def assets_dir() -> Path:
    """The packaged folder holding ``vocab.bpe`` and ``encoder.json`` (export copies from it)."""
    return _ASSETS / "gpt2"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise DataError(
            f"cannot read tokenizer file {path}: {e.strerror or e}. "
            "Reinstall gpt_ds (pip install -e .) to restore the packaged GPT-2 BPE files."
        ) from e
    return digest.hexdigest()


def tokenizer_fingerprint() -> dict[str, str]:
    """SHA-256 of each packaged BPE file, checked against the pinned digests.

    Raises DataError naming the file when one is missing or differs from the official one.
    """
    found = {}
    for name, expected in ASSET_SHA256.items():
        path = assets_dir() / name
        actual = _sha256_file(path)
        if actual != expected:
            raise DataError(
                f"tokenizer file {path} has SHA-256 {actual}, expected {expected} "
                "(the official GPT-2 file). It is corrupt or was replaced: restore it from "
                "the gpt_ds package (pip install -e . or a fresh checkout)."
            )
        found[name] = actual
    return found


@functools.cache
def get_encoding() -> tiktoken.Encoding:
    """tiktoken's ``gpt2`` encoding, built from the packaged files with no network access."""
    tokenizer_fingerprint()  # a clear DataError before tiktoken's bare assert/ValueError
    folder = assets_dir()
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(folder / "vocab.bpe"),
        encoder_json_file=str(folder / "encoder.json"),
        vocab_bpe_hash=ASSET_SHA256["vocab.bpe"],
        encoder_json_hash=ASSET_SHA256["encoder.json"],
    )
    enc = tiktoken.Encoding(
        name=TOKENIZER_NAME,
        explicit_n_vocab=VOCAB_SIZE,
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: EOT_TOKEN},
    )
    assert enc.eot_token == EOT_TOKEN and enc.n_vocab == VOCAB_SIZE
    return enc
