"""Token folders written by nanoGPT's ``prepare.py``: uint16 train.bin/val.bin, no meta.json.

nanoGPT's GPT-2 BPE preparations (shakespeare, openwebtext) write the same flat uint16 files as
gpt_ds does, with no description beside them; its character-level one (shakespeare_char) adds a
``meta.pkl`` with its own small vocabulary. `nanogpt_meta` stands in for the missing meta.json:
GPT-2 BPE ids are accepted (`gpt_ds.data.tokens` then checks every id against the
vocabulary), any other vocabulary is refused, since its ids mean nothing to GPT-2's embedding.

``meta.pkl`` is read with an unpickler that builds nothing but the plain containers and scalars
pickle encodes natively: loading an untrusted pickle the usual way can run any code.
"""

from __future__ import annotations

import pickle
import shlex
from pathlib import Path

from gpt_ds.base.errors import DataError
from gpt_ds.base.tool_names import tool
from gpt_ds.data.token_format import DTYPE
from gpt_ds.data.tokenizer import VOCAB_SIZE

FORMAT = "nanogpt.uint16"  # the "format" of the meta that stands in for meta.json
SPLITS = ("train", "val")


class _PlainUnpickler(pickle.Unpickler):
    """Dicts, lists, strings and numbers only: any class or function named is refused."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"it names {module}.{name}, and only plain data is read")


def read_meta_pkl(path: Path) -> dict:
    """nanoGPT's meta.pkl ({'vocab_size', 'itos', 'stoi'}) without running anything in it."""
    try:
        with open(path, "rb") as f:
            meta = _PlainUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as e:
        raise DataError(
            f"{path}: not a nanoGPT meta.pkl of plain data ({e}); remove it if the .bin files "
            f"hold GPT-2 BPE ids, or re-prepare the text with {tool('prepare_data')}"
        ) from e
    if not isinstance(meta, dict) or not isinstance(meta.get("vocab_size"), int):
        raise DataError(f"{path}: expected a dict with an integer 'vocab_size', as nanoGPT writes")
    return meta


def _vocabulary_kind(meta: dict) -> str:
    itos = meta.get("itos")
    values = itos.values() if isinstance(itos, dict) else ()
    chars = bool(values) and all(isinstance(c, str) and len(c) == 1 for c in values)
    return "a character-level vocabulary" if chars else "another tokenizer's vocabulary"


def _check_vocabulary(data_dir: Path) -> None:
    """Refuse a meta.pkl whose vocabulary is not GPT-2's."""
    path = data_dir / "meta.pkl"
    if not path.exists():
        return
    meta = read_meta_pkl(path)
    if meta["vocab_size"] != VOCAB_SIZE:
        out = shlex.quote(str(data_dir.parent / f"{data_dir.name}_gpt2"))
        raise DataError(
            f"{path}: vocab_size {meta['vocab_size']}, {_vocabulary_kind(meta)} (nanoGPT's "
            f"shakespeare_char writes such), not GPT-2's {VOCAB_SIZE}: its ids are not GPT-2 "
            "tokens, and GPT-2's tokenizer cannot train on them. Re-prepare the text with: "
            f"{tool('prepare_data')} --input YOUR_TEXT --out_dir {out}"
        )


def nanogpt_meta(data_dir: Path) -> dict:
    """The description a nanoGPT folder lacks, from its files: raises DataError for a meta.pkl
    of another vocabulary or a .bin file that is not whole uint16 values."""
    _check_vocabulary(data_dir)
    meta = {"format": FORMAT, "dtype": DTYPE, "tokenizer": "gpt2", "vocab_size": VOCAB_SIZE}
    for split in SPLITS:
        path = data_dir / f"{split}.bin"
        try:
            size = path.stat().st_size
        except OSError as e:
            raise DataError(f"{path}: cannot read it: {e.strerror or e}") from e
        if size % 2:
            raise DataError(
                f"{path}: {size} bytes, an odd number: not whole uint16 token ids (a truncated "
                f"copy?); copy it again or re-prepare the text with {tool('prepare_data')}"
            )
        meta[f"{split}_tokens"] = size // 2
    return meta


def note(data_dir: Path) -> str:
    """The line a run prints when it reads a nanoGPT folder."""
    return (
        f"data: {data_dir} has no gpt_ds meta.json: read as nanoGPT uint16 train.bin/val.bin "
        "(GPT-2 BPE ids)"
    )
