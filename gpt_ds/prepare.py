"""Tokenize text into the flat ``uint16`` token files the trainer memory-maps (nanoGPT format).

Output (``out_dir``):
    train.bin, val.bin   GPT-2 token ids, ``uint16``, no header: ``np.memmap(p, np.uint16, "r")``.
    meta.json            format/version, tokenizer and its SHA-256s, token counts, the split
                         rule and every source with its SHA-256, size and document count.

Inputs:
    * no inputs: the embedded Tiny Shakespeare corpus;
    * a file: ``.jsonl``/``.ndjson`` is JSON Lines, one ``{"text": "..."}`` object per line (blank
      lines skipped, other keys ignored, an empty text skipped); any other file is plain text,
      one document per file;
    * a folder: every file below it (recursively, symbolic links to folders not followed) whose
      suffix, in any case, is one of ``TEXT_SUFFIXES`` or ``JSONL_SUFFIXES``; hidden files and
      folders (name starting with ".") are skipped; files are taken in sorted relative-path
      order. The same file reached twice is read once.
    Text is UTF-8 (a leading byte-order mark is dropped); line ends are normalised to "\\n",
    as Python's text mode and nanoGPT's ``prepare.py`` do.

Documents and the split (deterministic: same inputs, same bytes out):
    * a plain text file is one document, split by characters as nanoGPT does:
      ``train = text[:int(n * (1 - val_fraction))]``, ``val`` = the rest; so every file gives
      ``val_fraction`` of its characters to val (Tiny Shakespeare at 0.1: 301,966 / 36,059 tokens);
    * JSON Lines documents are held out whole: counting the documents of all JSONL inputs in
      order from 0, document ``i`` goes to val when ``floor((i + 1) * f) > floor(i * f)``, i.e.
      every ``1/f``-th document (at f = 0.1 the 10th, 20th, ...), so the val share of documents
      is ``f`` to within one document. Many small documents belong in JSONL: splitting each
      of them by characters would put the ending of every one of them in val;
    * within each split, ``<|endoftext|>`` (50256) separates consecutive documents (none before
      the first, none after the last); a text file's train and val parts are separate pieces of
      their splits. Text that spells "<|endoftext|>" is encoded as ordinary text.

Speed and safety: text is read in blocks (never the whole corpus in memory), cut into chunks of
about ``CHUNK_CHARS`` characters only where the GPT-2 pre-tokeniser is known to break anyway, so
chunked encoding equals one-shot encoding, and each chunk is one ``encode_ordinary`` call in a
process pool. Tokens stream into hidden temporary files in ``out_dir`` that are renamed at the
end; an old ``meta.json`` is removed before the renames and the new one is renamed last, so a
folder with a ``meta.json`` always holds a complete, consistent dataset.
"""

from __future__ import annotations

import codecs
import collections
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from gpt_ds.errors import DataError
from gpt_ds.tokenizer import (
    DEFAULT_CORPUS,
    EOT_TOKEN,
    TOKENIZER_NAME,
    VOCAB_SIZE,
    get_encoding,
    tokenizer_fingerprint,
)

FORMAT = "gpt_ds.tokens"
FORMAT_VERSION = 1
DTYPE = "uint16"
TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".rst")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
# ~1M characters per encode call: ~0.2 s of work, large enough that the per-task overhead
# (pickling the text and the tokens) is a small fraction.
CHUNK_CHARS = 1 << 20
DEFAULT_BLOCK_SIZE = 1024
DEFAULT_MIN_VAL_TOKENS = DEFAULT_BLOCK_SIZE + 1  # one full evaluation window
SPLIT_RULE = (
    "text file: characters [0, int(n*(1-f))) train, rest val; JSONL document i (counted over "
    "all JSONL inputs): val if floor((i+1)*f) > floor(i*f); <|endoftext|> between documents"
)
_SPLITS = ("train", "val")

# Where a chunk may end without changing the tokens. In the gpt2 pattern no pre-token crosses a
# "\n" that has non-whitespace on both sides, nor starts anywhere but at the " " of "x y"; the
# pieces before such a point see at most one character past it (the "(?!\S)" look-ahead), which
# stays the same. Python's \s is a superset of Unicode White_Space (the Rust regex's \s), so
# "\S" here is the stricter side.
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")


@dataclass
class Source:
    """One input file and what was read from it (``sha256`` and ``documents`` after reading)."""

    path: Path
    kind: str  # "text" or "jsonl"
    bytes: int
    sha256: str = ""
    documents: int = 0

    def to_meta(self) -> dict:
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "bytes": self.bytes,
            "documents": self.documents,
        }


# --------------------------------------------------------------------------- inputs


def _kind(path: Path) -> str:
    return "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "text"


def _folder_files(folder: Path) -> list[Path]:
    wanted = TEXT_SUFFIXES + JSONL_SUFFIXES
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.startswith(".") and Path(name).suffix.lower() in wanted:
                found.append(Path(root) / name)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def discover_inputs(inputs: Iterable[Path | str] | None) -> list[Source]:
    """Expand files and folders into the ordered list of sources; no inputs: Tiny Shakespeare.

    Every file is opened once here so that a missing or unreadable one fails before any work.
    """
    paths = [Path(p) for p in inputs] if inputs else [DEFAULT_CORPUS]
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            below = _folder_files(path)
            if not below:
                raise DataError(
                    f"input folder {path} holds no input files (looked recursively for "
                    f"{', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES)}; hidden files are skipped)"
                )
            files.extend(below)
        elif path.exists():
            files.append(path)
        else:
            raise DataError(f"input path {path} does not exist")
    sources, seen = [], set()
    for path in files:
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


# --------------------------------------------------------------------------- reading


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


def _scan_text(source: Source) -> int:
    """First pass over a text file: its SHA-256 (stored on ``source``) and character count."""
    n_chars = 0
    try:
        reader = _HashingReader(open(source.path, "rb", buffering=0))  # noqa: SIM115
        with _open_text(source.path, reader) as f:
            for block in iter(lambda: f.read(CHUNK_CHARS), ""):
                n_chars += len(block)
    except UnicodeDecodeError:
        raise _utf8_error(source.path) from None
    except OSError as e:
        raise DataError(f"cannot read input file {source.path}: {e.strerror or e}") from e
    source.sha256 = reader.sha256.hexdigest()
    return n_chars


def _text_pieces(source: Source, val_fraction: float, chunk_chars: int) -> Iterator[tuple]:
    """Yield ``(split, text, new_document, approx_bytes)`` for one plain text file."""
    n_chars = _scan_text(source)
    source.documents = int(n_chars > 0)
    split_at = int(n_chars * (1 - val_fraction))
    bytes_per_char = source.bytes / max(n_chars, 1)
    try:
        with _open_text(source.path) as f:
            for split, count in (("train", split_at), ("val", n_chars - split_at)):
                new_doc, carry = True, ""
                while count > 0:
                    block = f.read(min(chunk_chars, count))
                    if not block:
                        raise DataError(f"input file {source.path} shrank while being read")
                    count -= len(block)
                    carry += block
                    cut = _last_safe_cut(carry) if count > 0 else None
                    if cut is not None:
                        yield split, carry[:cut], new_doc, cut * bytes_per_char
                        new_doc, carry = False, carry[cut:]
                for chunk in iter_safe_chunks(carry, chunk_chars):
                    yield split, chunk, new_doc, len(chunk) * bytes_per_char
                    new_doc = False
    except UnicodeDecodeError:
        raise _utf8_error(source.path) from None
    except OSError as e:
        raise DataError(f"cannot read input file {source.path}: {e.strerror or e}") from e


def _jsonl_documents(source: Source) -> Iterator[tuple[str, int]]:
    """Yield ``(text, line_bytes)`` for each non-empty document of a JSON Lines file."""
    sha = hashlib.sha256()
    try:
        with open(source.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                sha.update(raw)
                where = f"{source.path}:{lineno}"
                try:
                    line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{where}: not valid UTF-8 (byte {e.start + 1})") from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{where}: invalid JSON ({e.msg} at column {e.colno}); "
                        'expected one object per line like {"text": "..."}'
                    ) from None
                if not isinstance(record, dict) or "text" not in record:
                    raise DataError(f'{where}: expected an object with a "text" field')
                text = record["text"]
                if not isinstance(text, str):
                    raise DataError(f'{where}: "text" must be a string, got {type(text).__name__}')
                if text:
                    source.documents += 1
                    yield text, len(raw)
    except OSError as e:
        raise DataError(f"cannot read input file {source.path}: {e.strerror or e}") from e
    source.sha256 = sha.hexdigest()


def _jsonl_goes_to_val(index: int, val_fraction: float) -> bool:
    return math.floor((index + 1) * val_fraction) > math.floor(index * val_fraction)


def _pieces(sources: list[Source], val_fraction: float, chunk_chars: int) -> Iterator[tuple]:
    """All inputs as ``(split, text, new_document, approx_bytes)``, in order."""
    jsonl_index = 0
    for source in sources:
        if source.kind == "text":
            yield from _text_pieces(source, val_fraction, chunk_chars)
            continue
        for text, nbytes in _jsonl_documents(source):
            split = "val" if _jsonl_goes_to_val(jsonl_index, val_fraction) else "train"
            jsonl_index += 1
            for i, chunk in enumerate(iter_safe_chunks(text, chunk_chars)):
                yield split, chunk, i == 0, nbytes if i == 0 else 0


def _tasks(pieces: Iterable[tuple], chunk_chars: int) -> Iterator[tuple]:
    """Group small pieces per split into ``(split, [(text, new_document)], approx_bytes)``."""
    batch = {s: [] for s in _SPLITS}
    size = dict.fromkeys(_SPLITS, 0)
    nbytes = dict.fromkeys(_SPLITS, 0.0)
    for split, text, new_doc, piece_bytes in pieces:
        batch[split].append((text, new_doc))
        size[split] += len(text)
        nbytes[split] += piece_bytes
        if size[split] >= chunk_chars:
            yield split, batch[split], nbytes[split]
            batch[split], size[split], nbytes[split] = [], 0, 0.0
    for split in _SPLITS:
        if batch[split]:
            yield split, batch[split], nbytes[split]


# --------------------------------------------------------------------------- encoding


def encode_pieces(pieces: list[tuple[str, bool]]) -> np.ndarray:
    """Encode ``[(text, new_document)]`` to uint16, with EOT before every new document but the
    first (the writer decides about that one). Runs in the worker processes."""
    enc = get_encoding()
    parts = []
    for i, (text, new_doc) in enumerate(pieces):
        if new_doc and i > 0:
            parts.append(np.array([EOT_TOKEN], dtype=np.uint16))
        parts.append(np.array(enc.encode_ordinary(text), dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    get_encoding()


def _encoded(tasks: Iterable[tuple], workers: int) -> Iterator[tuple]:
    """Yield ``(split, first_is_new_document, tokens, approx_bytes)`` in task order, encoding
    with ``workers`` processes (in this process when 1) and at most 2 tasks per worker queued,
    so memory stays bounded whatever the input size."""
    if workers <= 1:
        for split, pieces, nbytes in tasks:
            yield split, pieces[0][1], encode_pieces(pieces), nbytes
        return
    with multiprocessing.get_context().Pool(workers, initializer=_init_worker) as pool:
        queued = collections.deque()
        for split, pieces, nbytes in tasks:
            queued.append((split, pieces[0][1], pool.apply_async(encode_pieces, (pieces,)), nbytes))
            if len(queued) >= 2 * workers:
                split_, new_doc, result, nb = queued.popleft()
                yield split_, new_doc, result.get(), nb
        while queued:
            split_, new_doc, result, nb = queued.popleft()
            yield split_, new_doc, result.get(), nb


def default_num_workers(total_bytes: int, chunk_chars: int = CHUNK_CHARS) -> int:
    """One process per usable CPU, but no more than there are chunks to encode."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, total_bytes // max(chunk_chars, 1)))


# --------------------------------------------------------------------------- writing


class _SplitWriter:
    """Appends uint16 tokens to a hidden temporary file, with EOT between documents."""

    def __init__(self, out_dir: Path, name: str):
        self.final = out_dir / f"{name}.bin"
        self.tmp = out_dir / f".{name}.bin.{os.getpid()}.tmp"
        self.file = open(self.tmp, "wb")  # noqa: SIM115
        self.tokens = 0

    def write(self, tokens: np.ndarray, new_document: bool) -> None:
        if new_document and self.tokens:
            self.file.write(np.array([EOT_TOKEN], dtype=np.uint16).data)
            self.tokens += 1
        self.file.write(np.ascontiguousarray(tokens, dtype=np.uint16).data)
        self.tokens += len(tokens)

    def close(self) -> None:
        if not self.file.closed:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()


def _check_args(val_fraction: float, num_workers: int | None, min_val_tokens: int) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if num_workers is not None and num_workers < 0:
        raise DataError(
            f"num_workers must be >= 0 (0 or 1: no worker processes), got {num_workers}"
        )
    if min_val_tokens < 0:
        raise DataError(f"min_val_tokens must be >= 0, got {min_val_tokens}")


def _make_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create output folder {out_dir}: {e.strerror or e}") from e
    if not os.access(out_dir, os.W_OK):
        raise DataError(f"output folder {out_dir} is not writable")


def _describe(sources: list[Source]) -> str:
    names = ", ".join(str(s.path) for s in sources[:3])
    return names + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")


def prepare_dataset(
    inputs: list[Path] | None,
    out_dir: Path,
    val_fraction: float = 0.1,
    num_workers: int | None = None,
    min_val_tokens: int = DEFAULT_MIN_VAL_TOKENS,
    progress: bool = True,
    chunk_chars: int = CHUNK_CHARS,
) -> dict:
    """Tokenize ``inputs`` (Tiny Shakespeare when empty) into ``out_dir``; return the meta.

    ``num_workers``: encoding processes (None: one per CPU, capped by the input size; 0 or 1:
    encode in this process). ``min_val_tokens``: fewest val tokens accepted (block_size + 1 to
    evaluate one window). Raises DataError naming the file or setting at fault.
    """
    from tqdm import tqdm

    _check_args(val_fraction, num_workers, min_val_tokens)
    out_dir = Path(out_dir)
    sources = discover_inputs(inputs)
    fingerprint = tokenizer_fingerprint()
    get_encoding()  # fail on a broken tokenizer before forking workers
    total_bytes = sum(s.bytes for s in sources)
    workers = default_num_workers(total_bytes, chunk_chars) if num_workers is None else num_workers
    _make_out_dir(out_dir)

    writers: dict[str, _SplitWriter] = {}
    encoded = None
    meta_tmp = out_dir / f".meta.json.{os.getpid()}.tmp"
    try:
        for split in _SPLITS:
            writers[split] = _SplitWriter(out_dir, split)
        tasks = _tasks(_pieces(sources, val_fraction, chunk_chars), chunk_chars)
        encoded = _encoded(tasks, workers)
        with tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc="tokenizing",
            file=sys.stderr,
            disable=not progress,
        ) as bar:
            for split, new_doc, tokens, nbytes in encoded:
                writers[split].write(tokens, new_doc)
                bar.update(min(round(nbytes), bar.total - bar.n))
                bar.set_postfix_str(
                    f"{(writers['train'].tokens + writers['val'].tokens) / 1e6:.2f}M tokens",
                    refresh=False,
                )
            bar.update(bar.total - bar.n)
        for writer in writers.values():
            writer.close()

        n_train, n_val = writers["train"].tokens, writers["val"].tokens
        if n_train + n_val == 0:
            raise DataError(f"no text to tokenize: the input is empty ({_describe(sources)})")
        if n_val < min_val_tokens:
            raise DataError(
                f"the validation split holds {n_val:,} tokens, fewer than the {min_val_tokens:,} "
                f"needed (block_size + 1, one evaluation window) from {_describe(sources)}. Raise "
                f"--val_fraction (now {val_fraction}), add more data or lower --block_size."
            )
        if n_train == 0:
            raise DataError(
                f"the training split is empty ({_describe(sources)}): "
                f"lower --val_fraction (now {val_fraction}) or add more data"
            )
        meta = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "dtype": DTYPE,
            "tokenizer": TOKENIZER_NAME,
            "tokenizer_sha256": fingerprint,
            "vocab_size": VOCAB_SIZE,
            "eot_token": EOT_TOKEN,
            "train_tokens": n_train,
            "val_tokens": n_val,
            "val_fraction": val_fraction,
            "split_rule": SPLIT_RULE,
            "documents": sum(s.documents for s in sources),
            "sources": [s.to_meta() for s in sources],
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        meta_tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (out_dir / "meta.json").unlink(missing_ok=True)  # no meta.json while bins are mixed
        for writer in writers.values():
            os.replace(writer.tmp, writer.final)
        os.replace(meta_tmp, out_dir / "meta.json")
        return meta
    except OSError as e:
        raise DataError(f"cannot write to output folder {out_dir}: {e.strerror or e}") from e
    finally:
        if encoded is not None:
            encoded.close()  # stops the worker pool now, also on errors and Ctrl-C
        for writer in writers.values():
            writer.file.close()
            writer.tmp.unlink(missing_ok=True)
        meta_tmp.unlink(missing_ok=True)
