"""Token data for training and evaluation: checked memmaps, training windows, eval windows.

`train.bin`/`val.bin` are flat uint16 GPT-2 token ids (nanoGPT's format) described by
`meta.json` (written by tools/prepare_data.py; its format: FORMAT, FORMAT_VERSION), or a folder
nanoGPT's own prepare.py wrote (read as GPT-2 ids, its meta stood in for). The training
windows come from the run's one counter-based stream: sequence i is a pure function of
(seed, i), each step takes the next global batch and each rank its share, so the state is one
integer (sequences drawn), a resumed run sees exactly the data an uninterrupted one would, and
neither the world size nor the micro-batch / accumulation split of a step matters.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpt_ds.base.cli import tool
from gpt_ds.base.dist import print0
from gpt_ds.base.errors import DataError
from gpt_ds.data.tokenizer import VOCAB_SIZE

# The token-file format: written by `gpt_ds.data.prepare.pipeline`, read by `gpt_ds.data.tokens`.
#
# `train.bin`/`val.bin` are flat arrays of GPT-2 token ids of dtype `DTYPE` with no header;
# `meta.json` names the format (`FORMAT`, `FORMAT_VERSION`) and the dtype, and records the
# inputs it was made from (`rebuild_command`). While gpt_ds.data.prepare.pipeline swaps new files
# in, the folder holds `INCOMPLETE_MARKER` (the new meta) and no meta.json: a folder left so by a
# crash is
# refused, not taken for one of nanoGPT's (which has no meta.json either).

FORMAT = "gpt_ds.tokens"
FORMAT_VERSION = 1
DTYPE = "uint16"
INCOMPLETE_MARKER = ".prepare_incomplete.json"


def rebuild_command(data_dir: str | Path) -> str:
    """How to re-create the dataset in `data_dir` from its own inputs, as meta.json records
    them: a fix hint must never turn a custom dataset into Tiny Shakespeare by omission."""
    from gpt_ds.data.tokenizer import DEFAULT_CORPUS

    data_dir = Path(data_dir)
    from gpt_ds.base.cli import tool

    base = f"{tool('prepare_data')} --out_dir {shlex.quote(str(data_dir))}"
    try:
        described = data_dir / "meta.json"
        if not described.exists():  # an interrupted commit: the new meta is in the marker
            described = data_dir / INCOMPLETE_MARKER
        meta = json.loads(described.read_text())
        paths = [str(s["path"]) for s in meta["sources"]]
        val_fraction = meta["val_fraction"]
    except (OSError, ValueError, KeyError, TypeError):
        return (
            "re-create it from its inputs (unknown here: no readable meta.json) with: "
            f"{base} --input YOUR_FILES_OR_FOLDERS"
        )
    if [Path(p) for p in paths] != [DEFAULT_CORPUS]:
        base += " --input " + " ".join(shlex.quote(p) for p in paths)
    if meta.get("text_key", "text") != "text":
        base += f" --text_key {shlex.quote(str(meta['text_key']))}"
    return f"re-create it with: {base} --val_fraction {val_fraction}"


SCAN_CHUNK = 1 << 24  # tokens per chunk when checking ids (32 MB of uint16)


@dataclass
class TokenData:
    train: np.ndarray  # memmap, uint16
    val: np.ndarray
    meta: dict


def load_token_data(data_dir: str | Path, vocab_size: int, block_size: int) -> TokenData:
    """Open and check a prepared dataset; every problem is a DataError naming the file.

    Checks: meta.json parses and describes GPT-2 tokens of our tokenizer, each .bin has exactly
    the size meta.json promises (a truncated copy is caught), no id is beyond the vocabulary,
    and both splits hold at least one block + 1 tokens. A folder with no meta.json is read as
    nanoGPT's (`gpt_ds.data.tokens`), unless an interrupted tools/prepare_data.py left it.
    """
    data_dir = Path(data_dir)
    if (data_dir / "meta.json").exists() or (data_dir / INCOMPLETE_MARKER).exists():
        meta = _read_meta(data_dir, vocab_size)
    else:
        meta = nanogpt_meta(data_dir)
        print0(nanogpt_note(data_dir))
    splits = {}
    for split in ("train", "val"):
        path = data_dir / f"{split}.bin"
        expected = int(meta.get(f"{split}_tokens", -1))
        size = path.stat().st_size if path.exists() else -1
        if size != expected * 2:
            raise DataError(
                f"{path}: {size} bytes, but meta.json says {expected} uint16 tokens "
                f"({expected * 2} bytes): the file is truncated or from another dataset; "
                f"{rebuild_command(data_dir)}"
            )
        if expected < block_size + 1:
            raise DataError(
                f"{path}: {expected} tokens, fewer than one block of {block_size} + 1; "
                "use more data, a larger --val_fraction, or a smaller --block_size"
            )
        tokens = np.memmap(path, dtype=DTYPE, mode="r")
        _check_ids(tokens, vocab_size, path)
        splits[split] = tokens
    return TokenData(train=splits["train"], val=splits["val"], meta=meta)


def _read_meta(data_dir: Path, vocab_size: int) -> dict:
    """meta.json, checked against this package's format and tokenizer. Training reads token
    ids only: the meta's digests are compared with the official GPT-2 files' (what prepare_data
    checked the packaged files against), with no need for the files themselves."""
    from gpt_ds.data.tokenizer import ASSET_SHA256, TOKENIZER_NAME

    meta_path = data_dir / "meta.json"
    hint = rebuild_command(data_dir)
    if not meta_path.exists():  # the marker without meta.json: the .bin files may be mixed
        raise DataError(
            f"{data_dir}: an interrupted {tool('prepare_data')} left it half-written (no "
            f"meta.json; train.bin and val.bin may be from different runs); {hint}"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{meta_path}: cannot read dataset description: {exc}") from exc
    if meta.get("format") != FORMAT or meta.get("dtype") != DTYPE:
        raise DataError(f"{meta_path}: not a gpt_ds token dataset (format/dtype); {hint}")
    if meta.get("tokenizer") != TOKENIZER_NAME or meta.get("tokenizer_sha256") != ASSET_SHA256:
        raise DataError(
            f"{meta_path}: made with tokenizer {meta.get('tokenizer')!r} "
            f"({meta.get('tokenizer_sha256')}), not this package's GPT-2 BPE; {hint}"
        )
    if meta.get("vocab_size", 0) > vocab_size:
        raise DataError(
            f"{meta_path}: vocab_size {meta['vocab_size']} exceeds the model's {vocab_size}"
        )
    return meta


def _check_ids(tokens: np.ndarray, vocab_size: int, path: Path) -> None:
    for start in range(0, len(tokens), SCAN_CHUNK):
        chunk = tokens[start : start + SCAN_CHUNK]
        top = int(chunk.max())
        if top >= vocab_size:
            pos = start + int(np.argmax(chunk >= vocab_size))
            raise DataError(
                f"{path}: token id {int(tokens[pos])} at position {pos} is beyond the "
                f"vocabulary ({vocab_size}); the file is corrupt or from another tokenizer"
            )


# the Philox key word of a run's one global stream
GLOBAL_STREAM = 2**64 - 1
STREAM = "global"  # the stream a rank state and a manifest name (older gpt_ds: "per_rank")


@dataclass(frozen=True)
class GlobalSplit:
    """How the ranks share each optimizer step's global batch: `world_size` ranks, each
    drawing `grad_accum` micro-batches."""

    world_size: int
    grad_accum: int


class TrainWindows:
    """The training windows a rank draws, from the run's one global stream of sequences.

    Sequence i starts at an offset drawn from Philox, a counter-based generator, at counter i:
    any stretch of a stream is computed directly, without drawing what comes before it. The
    global stream (key: seed, GLOBAL_STREAM) is a pure function of (seed, i): each optimizer
    step takes the next global batch from a running count (`sequences`), rank r the r-th
    contiguous share of it and each micro-batch the next part of that share. So every step
    trains on the same sequences at any world size, micro-batch or accumulation with the same
    global batch.

    `next_batch()` returns (x, y) of shape (B, T): y is x shifted by one token.
    """

    def __init__(
        self, tokens: np.ndarray, block_size: int, batch_size: int, seed: int, rank: int,
        split: GlobalSplit,
    ):  # fmt: skip
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.seed, self.rank, self.split = seed, rank, split
        self.sequences = 0  # drawn so far by all ranks, before this step
        self.micro_step = 0  # micro-batches of this step drawn

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, all ranks."""
        return self.split.world_size * self.split.grad_accum * self.batch_size

    def units(self, first: int, count: int, word: int = 0) -> np.ndarray:
        """Uniforms in [0, 1) of sequences first .. first + count - 1 of this stream: each
        counter step gives four 64-bit words; sequence i takes word `word` after counter i
        (0 places its window; mixture.py draws its source from 1)."""
        key = np.array([self.seed % 2**64, GLOBAL_STREAM], dtype=np.uint64)
        raw = np.random.Philox(key=key, counter=first).random_raw(4 * count)[word::4]
        return (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53  # 53 random bits

    def starts(self, first: int, count: int) -> np.ndarray:
        """Window offsets of sequences first .. first + count - 1 of this stream."""
        return self.offsets(self.units(first, count))

    def offsets(self, unit: np.ndarray) -> np.ndarray:
        """Window offsets in these tokens for uniforms in [0, 1)."""
        high = len(self.tokens) - self.block_size - 1  # offsets 0 .. high - 1
        return np.minimum((unit * high).astype(np.int64), high - 1)  # rounding never gives high

    def take(self) -> int:
        """The first sequence index of this rank's next micro-batch; advances the count."""
        share = self.split.grad_accum * self.batch_size
        first = self.sequences + self.rank * share + self.micro_step * self.batch_size
        self.micro_step += 1
        if self.micro_step == self.split.grad_accum:  # the step's global batch is taken
            self.sequences, self.micro_step = self.sequences + self.global_batch, 0
        return first

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return window_batch(self.tokens, self.starts(self.take(), self.batch_size), self.block_size)

    def step_signature(self, first: int, count: int) -> np.ndarray:
        """What identifies sequences first .. first + count - 1: their window offsets."""
        return self.starts(first, count)

    def last_step_hash(self) -> str | None:
        """A short hash of the global batch of the step drawn last (None before a step):
        equal at any world size and split."""
        if self.sequences == 0 or self.micro_step:
            return None
        first = self.sequences - self.global_batch
        signature = self.step_signature(first, self.global_batch)
        return hashlib.blake2b(signature.tobytes(), digest_size=6).hexdigest()

    def state_dict(self) -> dict:
        return {
            "seed": self.seed,
            "rank": self.rank,
            "stream": STREAM,
            "sequences": self.sequences,
            "micro_batch_size": self.batch_size,  # for the record; the state is `sequences`
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue after the state's `sequences` (a checkpoint of another stream is refused
        before the run starts: plan.check_continuable)."""
        if state["seed"] != self.seed:
            raise DataError(f"training-window state has seed {state['seed']}, this run {self.seed}")
        saved = state.get("stream")
        if saved != STREAM:
            raise DataError(f"training-window state is of the {saved} stream, this run's {STREAM}")
        self.micro_step = 0
        self.sequences = int(state["sequences"])


def eval_windows(num_tokens: int, block_size: int, count: int) -> np.ndarray:
    """Start offsets of `count` fixed windows spread evenly over the val split.

    Fixed (not random) so every evaluation, in every run and at every world size, scores the
    same tokens. Windows do not overlap while the split is long enough.
    """
    last = num_tokens - block_size - 1
    if count <= 1:
        return np.zeros(1, dtype=np.int64)
    return np.linspace(0, last, num=count).round().astype(np.int64)


def window_batch(tokens: np.ndarray, starts: np.ndarray, block_size: int):
    """(x, y) for the given window starts; shape (len(starts), block_size)."""
    return xy_batch([tokens[s : s + block_size + 1] for s in starts])


def xy_batch(windows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) from windows of block_size + 1 tokens: y is x shifted by one token."""
    batch = torch.from_numpy(np.stack(windows).astype(np.int64))
    return batch[:, :-1], batch[:, 1:]


# Token folders written by nanoGPT's ``prepare.py``: uint16 train.bin/val.bin, no meta.json.
#
# nanoGPT's GPT-2 BPE preparations (shakespeare, openwebtext) write the same flat uint16 files as
# gpt_ds does, with no description beside them; its character-level one (shakespeare_char) adds a
# ``meta.pkl`` with its own small vocabulary. `nanogpt_meta` stands in for the missing meta.json:
# GPT-2 BPE ids are accepted (`gpt_ds.data.tokens` then checks every id against the
# vocabulary), any other vocabulary is refused, since its ids mean nothing to GPT-2's embedding.
#
# ``meta.pkl`` is read with an unpickler that builds nothing but the plain containers and scalars
# pickle encodes natively: loading an untrusted pickle the usual way can run any code.

NANOGPT_FORMAT = "nanogpt.uint16"  # the "format" of the meta that stands in for meta.json
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
    meta = {"format": NANOGPT_FORMAT, "dtype": DTYPE, "tokenizer": "gpt2", "vocab_size": VOCAB_SIZE}
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


def nanogpt_note(data_dir: Path) -> str:
    """The line a run prints when it reads a nanoGPT folder."""
    return (
        f"data: {data_dir} has no gpt_ds meta.json: read as nanoGPT uint16 train.bin/val.bin "
        "(GPT-2 BPE ids)"
    )
