"""Encoding and writing for `gpt_ds.data.prepare.pipeline`: pieces -> tasks -> tokens -> split
files.

`batch_tasks` groups the `Piece`s of `gpt_ds.data.prepare.inputs` into `Task`s of about
`CHUNK_CHARS` characters per split; `encode_in_order` encodes them in a process pool and yields
`Encoded` results in task order; a `SplitWriter` appends them to a hidden temporary file.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
from collections.abc import Generator, Iterable, Iterator, Sequence
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tiktoken

from gpt_ds.data.prepare.inputs import CHUNK_CHARS, SPLITS, Piece
from gpt_ds.data.tokenizer import EOT_TOKEN, get_encoding
from gpt_ds.data.tokens import DTYPE


class Task(NamedTuple):
    """Consecutive pieces of one split, encoded by one call of `encode_pieces`."""

    split: str
    pieces: list[Piece]
    approx_bytes: float  # input bytes the pieces stand for


class Encoded(NamedTuple):
    """One task's tokens, with EOT already between its documents but not before the first."""

    split: str
    new_document: bool  # the first piece starts a document
    tokens: np.ndarray
    approx_bytes: float


def batch_tasks(pieces: Iterable[Piece], chunk_chars: int) -> Iterator[Task]:
    """Group small pieces per split into tasks of at least ``chunk_chars`` characters (except
    each split's last), keeping the order within each split."""
    batch: dict[str, list[Piece]] = {s: [] for s in SPLITS}
    size = dict.fromkeys(SPLITS, 0)
    nbytes = dict.fromkeys(SPLITS, 0.0)
    for piece in pieces:
        split = piece.split
        batch[split].append(piece)
        size[split] += len(piece.text)
        nbytes[split] += piece.approx_bytes
        if size[split] >= chunk_chars:
            yield Task(split, batch[split], nbytes[split])
            batch[split], size[split], nbytes[split] = [], 0, 0.0
    for split in SPLITS:
        if batch[split]:
            yield Task(split, batch[split], nbytes[split])


def encode_pieces(pieces: Sequence[Piece]) -> np.ndarray:
    """Encode pieces to uint16, with EOT before every new document but the first (the writer
    decides about that one). Runs in the worker processes."""
    enc = get_encoding()
    parts = []
    for i, piece in enumerate(pieces):
        if piece.new_document and i > 0:
            parts.append(np.array([EOT_TOKEN], dtype=DTYPE))
        parts.append(encode_ordinary(enc, piece.text))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=DTYPE)


def encode_ordinary(enc: tiktoken.Encoding, text: str) -> np.ndarray:
    """``enc.encode_ordinary(text)`` as uint16, without a Python list of ints in between:
    building and converting it made preparation a quarter slower (benchmarks/prepare.py).
    With no special token allowed or disallowed, ``encode_to_numpy`` is the same encoding."""
    try:
        tokens = enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())
    except UnicodeEncodeError:  # lone surrogates (JSON "\ud800"): encode_ordinary mends them
        return np.array(enc.encode_ordinary(text), dtype=DTYPE)
    return tokens.astype(DTYPE)


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    get_encoding()


def encode_in_order(tasks: Iterable[Task], workers: int) -> Generator[Encoded, None, None]:
    """Encode ``tasks`` with ``workers`` processes (in this process when 1), yielding results in
    task order, with at most 2 tasks per worker queued so memory stays bounded whatever the
    input size. Closing the generator stops the pool."""
    if workers <= 1:
        for task in tasks:
            yield _encoded(task, encode_pieces(task.pieces))
        return
    with multiprocessing.get_context().Pool(workers, initializer=_init_worker) as pool:
        # (task, its pending result), oldest first
        queued: collections.deque[tuple[Task, AsyncResult[np.ndarray]]] = collections.deque()
        for task in tasks:
            queued.append((task, pool.apply_async(encode_pieces, (task.pieces,))))
            if len(queued) >= 2 * workers:
                task, pending = queued.popleft()
                yield _encoded(task, pending.get())
        while queued:
            task, pending = queued.popleft()
            yield _encoded(task, pending.get())


def _encoded(task: Task, tokens: np.ndarray) -> Encoded:
    return Encoded(task.split, task.pieces[0].new_document, tokens, task.approx_bytes)


def default_num_workers(total_bytes: int, chunk_chars: int = CHUNK_CHARS) -> int:
    """One process per usable CPU, but no more than there are chunks to encode."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, total_bytes // max(chunk_chars, 1)))


class SplitWriter:
    """Appends uint16 tokens to a hidden temporary file, with EOT between documents."""

    def __init__(self, out_dir: Path, name: str):
        self.final = out_dir / f"{name}.bin"
        self.tmp = out_dir / f".{name}.bin.{os.getpid()}.tmp"
        self.file = open(self.tmp, "wb")  # noqa: SIM115
        self.tokens = 0

    def write(self, tokens: np.ndarray, new_document: bool) -> None:
        if new_document and self.tokens:
            self.file.write(np.array([EOT_TOKEN], dtype=DTYPE).data)
            self.tokens += 1
        self.file.write(np.ascontiguousarray(tokens, dtype=DTYPE).data)
        self.tokens += len(tokens)

    def close(self) -> None:
        if not self.file.closed:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
