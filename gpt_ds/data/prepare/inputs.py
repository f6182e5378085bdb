"""The inputs of `gpt_ds.data.prepare.pipeline`: finding the files, reading and hashing them,
the split.

`discover_inputs` turns files and folders into `Source`s; `read_pieces` streams them as `Piece`s
of text, each bound for one split, and reports a `SourceSummary` (SHA-256, document count) when
a source has been read to its end. The rules (which files, how text is split, UTF-8 handling)
are described in `gpt_ds/data/prepare/pipeline.py`; the rows of Parquet and Arrow files are read by
`gpt_ds.data.prepare.tables` and split as JSON Lines documents are.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gpt_ds.base.errors import DataError
from gpt_ds.data.prepare.tables import TABLE_SUFFIXES, require, table_documents
from gpt_ds.data.tokenizer import DEFAULT_CORPUS

TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".rst")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
INPUT_SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + TABLE_SUFFIXES
# ~1M characters per encode call: ~0.2 s of work, large enough that the per-task overhead
# (pickling the text and the tokens) is a small fraction.
CHUNK_CHARS = 1 << 20
SPLITS = ("train", "val")

# Where a chunk may end without changing the tokens. In the gpt2 pattern no pre-token crosses a
# "\n" that has non-whitespace on both sides, nor starts anywhere but at the " " of "x y"; the
# pieces before such a point see at most one character past it (the "(?!\S)" look-ahead), which
# stays the same. Python's \s is a superset of Unicode White_Space (the Rust regex's \s), so
# "\S" here is the stricter side.
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")


@dataclass(frozen=True)
class Source:
    """One input file, as found before reading it."""

    path: Path
    kind: str  # "text", "jsonl" or "table" (Parquet, Arrow)
    bytes: int


@dataclass(frozen=True)
class SourceSummary:
    """One input file once read to its end: what `meta.json` lists for it."""

    path: Path
    sha256: str
    bytes: int
    documents: int

    def to_meta(self) -> dict:
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "bytes": self.bytes,
            "documents": self.documents,
        }


class Piece(NamedTuple):
    """A run of text bound for one split, in input order.

    `new_document`: the text starts a document (the writer puts EOT before it unless it is the
    first of its split). `approx_bytes`: the input bytes it stands for (for the progress bar).
    """

    split: str
    text: str
    new_document: bool
    approx_bytes: float


# --------------------------------------------------------------------------- discovery


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in TABLE_SUFFIXES:
        return "table"
    return "jsonl" if suffix in JSONL_SUFFIXES else "text"


def _folder_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and Path(name).suffix.lower() in INPUT_SUFFIXES:
                found.append(Path(root) / name)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def _input_files(paths: list[Path]) -> list[Path]:
    """Every file named or found below a named folder, in order (duplicates kept)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            below = _folder_files(path)
            if not below:
                raise DataError(
                    f"input folder {path} holds no input files (looked recursively for "
                    f"{', '.join(INPUT_SUFFIXES)}; hidden files are skipped)"
                )
            files.extend(below)
        elif path.exists():
            files.append(path)
        else:
            raise DataError(f"input path {path} does not exist")
    return files


def discover_inputs(inputs: Iterable[Path | str] | None) -> list[Source]:
    """Expand files and folders into the ordered list of sources; no inputs: Tiny Shakespeare.

    Every file is opened once here so that a missing or unreadable one fails before any work.
    """
    paths = [Path(p) for p in inputs] if inputs else [DEFAULT_CORPUS]
    sources, seen = [], set()
    for path in _input_files(paths):
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        try:
            with open(path, "rb"):
                pass
            size = path.stat().st_size
        except OSError as e:
            raise DataError(f"cannot read input file {path}: {e.strerror or e}") from e
        sources.append(Source(path=path, kind=_kind(path), bytes=size))
    tables = [s.path for s in sources if s.kind == "table"]
    if tables:
        require("pyarrow", f"reading {tables[0]}")
    return sources


# --------------------------------------------------------------------------- chunking


def iter_safe_chunks(text: str, chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """Cut ``text`` into pieces of about ``chunk_chars`` characters (at least that many, except
    the last) whose separate GPT-2 encodings, concatenated, equal the encoding of ``text``."""
    start = 0
    while len(text) - start > chunk_chars:
        cut = _SAFE_CUT.search(text, start + chunk_chars)
        if cut is None:
            break
        yield text[start : cut.start()]
        start = cut.start()
    if start < len(text):
        yield text[start:]


def _last_safe_cut(text: str) -> int | None:
    """A safe cut close to the end of ``text`` (within the last 4K characters when possible)."""
    for back in (1 << 12, 1 << 16, 1 << 20, len(text)):
        cut = _SAFE_CUT.search(text, max(1, len(text) - back))
        if cut is not None:
            return cut.start()
    return None


# --------------------------------------------------------------------------- text files


class _HashingReader(io.RawIOBase):
    """A raw binary stream that hashes the bytes read through it."""

    def __init__(self, raw):
        self._raw = raw
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()
        super().close()

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        if n:
            self.sha256.update(memoryview(buffer)[:n])
        return n


def _open_text(path: Path, raw=None) -> io.TextIOWrapper:
    raw = raw if raw is not None else open(path, "rb", buffering=0)  # noqa: SIM115
    return io.TextIOWrapper(io.BufferedReader(raw, 1 << 20), encoding="utf-8-sig")


def _utf8_error(path: Path) -> DataError:
    """Locate the first invalid UTF-8 byte of ``path`` (called after decoding failed)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    with open(path, "rb") as f:
        for block in itertools.chain(iter(lambda: f.read(1 << 20), b""), [b""]):
            pending = decoder.getstate()[0]
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                data = pending + block
                at = offset - len(pending) + e.start
                line += data[: e.start].count(b"\n")
                return DataError(
                    f"input file {path} is not valid UTF-8: byte 0x{data[e.start]:02x} at offset "
                    f"{at} (line {line}). Convert it to UTF-8 (e.g. iconv -t UTF-8) or remove it."
                )
            offset += len(block)
            line += block.count(b"\n")
    return DataError(f"input file {path} is not valid UTF-8")


def _scan_text(path: Path) -> tuple[str, int]:
    """First pass over a text file: (its SHA-256, its character count)."""
    n_chars = 0
    try:
        reader = _HashingReader(open(path, "rb", buffering=0))  # noqa: SIM115
        with _open_text(path, reader) as f:
            for block in iter(lambda: f.read(CHUNK_CHARS), ""):
                n_chars += len(block)
    except UnicodeDecodeError:
        raise _utf8_error(path) from None
    except OSError as e:
        raise DataError(f"cannot read input file {path}: {e.strerror or e}") from e
    return reader.sha256.hexdigest(), n_chars


def _split_pieces(
    f: io.TextIOWrapper, path: Path, split: str, count: int, chunk_chars: int, per_char: float
) -> Iterator[Piece]:
    """The next ``count`` characters of ``f`` (the open ``path``) as pieces of ``split``, the
    first starting a document; ``per_char``: input bytes per character."""
    new_doc, carry = True, ""
    while count > 0:
        block = f.read(min(chunk_chars, count))
        if not block:
            raise DataError(f"input file {path} shrank while being read")
        count -= len(block)
        carry += block
        cut = _last_safe_cut(carry) if count > 0 else None
        if cut is not None:
            yield Piece(split, carry[:cut], new_doc, cut * per_char)
            new_doc, carry = False, carry[cut:]
    for chunk in iter_safe_chunks(carry, chunk_chars):
        yield Piece(split, chunk, new_doc, len(chunk) * per_char)
        new_doc = False


def _text_pieces(
    source: Source, val_fraction: float, chunk_chars: int
) -> Generator[Piece, None, SourceSummary]:
    """One plain text file: its train part, then its val part; returns its summary."""
    sha256, n_chars = _scan_text(source.path)
    split_at = int(n_chars * (1 - val_fraction))
    per_char = source.bytes / max(n_chars, 1)
    try:
        with _open_text(source.path) as f:
            for split, count in (("train", split_at), ("val", n_chars - split_at)):
                yield from _split_pieces(f, source.path, split, count, chunk_chars, per_char)
    except UnicodeDecodeError:
        raise _utf8_error(source.path) from None
    except OSError as e:
        raise DataError(f"cannot read input file {source.path}: {e.strerror or e}") from e
    return SourceSummary(source.path, sha256, source.bytes, int(n_chars > 0))


# --------------------------------------------------------------------------- JSON Lines files


def _jsonl_text(raw: bytes, lineno: int, where: str, key: str) -> str | None:
    """The text (field ``key``) of one line of a JSON Lines file; None for a blank line."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not valid UTF-8 (byte {e.start + 1})") from None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{where}: invalid JSON ({e.msg} at column {e.colno}); "
            f'expected one object per line like {{{json.dumps(key)}: "..."}}'
        ) from None
    if not isinstance(record, dict) or key not in record:
        fields = f" (its fields: {', '.join(record)})" if isinstance(record, dict) else ""
        raise DataError(
            f"{where}: expected an object with a {json.dumps(key)} field{fields}; "
            "name the field that holds the text with --text_key"
        )
    text = record[key]
    if not isinstance(text, str):
        raise DataError(f"{where}: {json.dumps(key)} must be a string, got {type(text).__name__}")
    return text


def _jsonl_documents(path: Path, key: str, sha256) -> Iterator[tuple[str, int]]:
    """``(text, line_bytes)`` for each non-empty document; every line read goes into ``sha256``."""
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                sha256.update(raw)
                text = _jsonl_text(raw, lineno, f"{path}:{lineno}", key)
                if text:
                    yield text, len(raw)
    except OSError as e:
        raise DataError(f"cannot read input file {path}: {e.strerror or e}") from e


def _jsonl_goes_to_val(index: int, val_fraction: float) -> bool:
    return math.floor((index + 1) * val_fraction) > math.floor(index * val_fraction)


def _document_pieces(
    source: Source, key: str, val_fraction: float, chunk_chars: int, index: Iterator[int]
) -> Generator[Piece, None, SourceSummary]:
    """One JSON Lines or table file, whole documents to one split; ``index`` counts over all
    such files. Returns its summary."""
    sha256, documents = hashlib.sha256(), 0
    read = table_documents if source.kind == "table" else _jsonl_documents
    for text, nbytes in read(source.path, key, sha256):
        split = "val" if _jsonl_goes_to_val(next(index), val_fraction) else "train"
        documents += 1
        for i, chunk in enumerate(iter_safe_chunks(text, chunk_chars)):
            yield Piece(split, chunk, i == 0, nbytes if i == 0 else 0)
    return SourceSummary(source.path, sha256.hexdigest(), source.bytes, documents)


def read_pieces(
    sources: list[Source],
    val_fraction: float,
    chunk_chars: int,
    finished: Callable[[SourceSummary], None],
    text_key: str = "text",
) -> Iterator[Piece]:
    """All inputs as pieces, in order; ``finished(summary)`` as each source is read to its end.
    ``text_key``: the field (JSON Lines) or column (tables) that holds each document's text."""
    index = itertools.count()  # documents of JSONL and table inputs, counted together
    for source in sources:
        if source.kind == "text":
            summary = yield from _text_pieces(source, val_fraction, chunk_chars)
        else:
            summary = yield from _document_pieces(
                source, text_key, val_fraction, chunk_chars, index
            )
        finished(summary)
