"""Tokenize text into the flat ``uint16`` token files the trainer memory-maps (nanoGPT format).

Output (``out_dir``):
    train.bin, val.bin   GPT-2 token ids, ``uint16``, no header: ``np.memmap(p, np.uint16, "r")``.
    meta.json            format/version, tokenizer and its SHA-256s, token counts, the split
                         rule and every source with its SHA-256, size and document count.

Inputs:
    * no inputs: the embedded Tiny Shakespeare corpus;
    * a file: ``.jsonl``/``.ndjson`` is JSON Lines, one ``{"text": "..."}`` object per line (blank
      lines skipped, other keys ignored, an empty text skipped; ``text_key`` names the field);
      ``.parquet``, ``.arrow`` (Arrow IPC, file or stream format) and ``.feather`` are tables,
      one document per row, read from the string column ``text_key`` in record batches (an
      empty string skipped, a null refused; needs the ``data`` extra: pyarrow); any other file
      is plain text, one document per file;
    * a folder: every file below it (recursively, symbolic links to folders not followed) whose
      suffix, in any case, is one of ``INPUT_SUFFIXES``; hidden files and folders (name starting
      with ".") are skipped; files are taken in sorted relative-path order. The same file
      reached twice is read once. A folder of Parquet shards, or one written by a Hugging Face
      dataset's ``save_to_disk``, is read this way too;
    * ``hf_dataset``: a Hugging Face dataset, a ``save_to_disk`` folder (a ``DatasetDict``:
      ``split`` picks one) or a hub name for ``datasets.load_dataset(name, split=split)``
      where the hub is reachable; read as the Arrow files it is stored in, after ``inputs``.
    Text is UTF-8 (a leading byte-order mark is dropped); line ends are normalised to "\\n",
    as Python's text mode and nanoGPT's ``prepare.py`` do.

Documents and the split (deterministic: same inputs, same bytes out):
    * a plain text file is one document, split by characters as nanoGPT does:
      ``train = text[:int(n * (1 - val_fraction))]``, ``val`` = the rest; so every file gives
      ``val_fraction`` of its characters to val (Tiny Shakespeare at 0.1: 301,966 / 36,059 tokens);
    * JSON Lines and table documents are held out whole: counting the documents of all JSONL
      and table inputs in order from 0, document ``i`` goes to val when
      ``floor((i + 1) * f) > floor(i * f)``, i.e. every ``1/f``-th document (at f = 0.1 the
      10th, 20th, ...), so the val share of documents is ``f`` to within one document (the same
      documents as JSONL or as a table give the same tokens). Many small documents belong in
      JSONL or tables: splitting each of them by characters would put the ending of every one
      of them in val;
    * within each split, ``<|endoftext|>`` (50256) separates consecutive documents (none before
      the first, none after the last); a text file's train and val parts are separate pieces of
      their splits. Text that spells "<|endoftext|>" is encoded as ordinary text.

Speed and safety: text is read in blocks (never the whole corpus in memory), cut into chunks of
about ``CHUNK_CHARS`` characters only where the GPT-2 pre-tokeniser is known to break anyway, so
chunked encoding equals one-shot encoding, and each chunk is one ``encode_ordinary`` call in a
process pool. Tokens stream into hidden temporary files in ``out_dir`` that are renamed at the
end; an old ``meta.json`` is removed before the renames and the new one is renamed last, so a
folder with a ``meta.json`` always holds a complete, consistent dataset (meanwhile
``INCOMPLETE_MARKER`` says the folder is half-written: without it, one with no ``meta.json``
would be read as nanoGPT's).

Code: finding, reading and hashing the inputs and the split are in ``gpt_ds.data.prepare.inputs``;
Parquet/Arrow and Hugging Face inputs in ``gpt_ds.data.prepare.tables``; encoding and the split
files in ``gpt_ds.data.prepare.encode``; the format constants in ``gpt_ds.data.tokens``. This
module holds the options and the job that ties them together.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpt_ds.base.cli import option
from gpt_ds.base.errors import ConfigError, DataError
from gpt_ds.base.processes import pid_alive
from gpt_ds.data.prepare.encode import (
    SplitWriter,
    batch_tasks,
    default_num_workers,
    encode_in_order,
)
from gpt_ds.data.prepare.inputs import (
    CHUNK_CHARS,
    SPLITS,
    Source,
    SourceSummary,
    discover_inputs,
    read_pieces,
)
from gpt_ds.data.prepare.tables import hf_dataset_files
from gpt_ds.data.tokenizer import (
    EOT_TOKEN,
    TOKENIZER_NAME,
    VOCAB_SIZE,
    get_encoding,
    tokenizer_fingerprint,
)
from gpt_ds.data.tokens import DTYPE, FORMAT, FORMAT_VERSION, INCOMPLETE_MARKER

SPLIT_RULE = (
    "text file: characters [0, int(n*(1-f))) train, rest val; JSONL or table document i "
    "(counted over all JSONL and table inputs): val if floor((i+1)*f) > floor(i*f); "
    "<|endoftext|> between documents"
)


@dataclass
class PrepareOptions:
    """Tokenize text into train.bin / val.bin / meta.json for gpt_ds (GPT-2 BPE, uint16)."""

    input: list[Path] | None = option(
        None,
        "text files, .jsonl files ({'text': ...} per line), .parquet / .arrow / .feather "
        "tables (one document per row) or folders of them (default: the embedded Tiny "
        "Shakespeare, unless --hf_dataset is given)",
        metavar="PATH",
    )
    text_key: str = option(
        "text", "the field of a JSON Lines record, or the column of a table, holding the text"
    )
    hf_dataset: str | None = option(
        None,
        "a Hugging Face dataset: a folder written by save_to_disk, or a hub name (needs the "
        "network); read after --input. Needs pip install 'gpt_ds[data]'",
        metavar="NAME_OR_PATH",
    )
    split: str = option("train", "the split of --hf_dataset to read (a DatasetDict or the hub)")
    out_dir: Path = option(Path("data/shakespeare"), "where train.bin, val.bin, meta.json go")
    val_fraction: float = option(0.1, "share held out for val")
    num_workers: int | None = option(
        None, "encoding processes (default: one per CPU, capped by the input size; 0: none)"
    )
    block_size: int = option(
        1024, "context length you will train with: val must hold at least block_size + 1 tokens"
    )
    quiet: bool = option(False, "no progress bar")


def _check_args(
    val_fraction: float, num_workers: int | None, min_val_tokens: int, block_size: int
) -> None:
    if block_size < 1:
        raise ConfigError(f"--block_size must be >= 1, got {block_size}")
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
    _remove_stale_temporaries(out_dir)


def _remove_stale_temporaries(out_dir: Path) -> None:
    """Hidden `.NAME.PID.tmp` files of runs that were killed (SIGKILL leaves them behind)."""
    for tmp in out_dir.glob(".*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not pid_alive(pid):
            tmp.unlink(missing_ok=True)


def _describe(sources: list[Source]) -> str:
    names = ", ".join(str(s.path) for s in sources[:3])
    return names + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")


def _write_tokens(
    sources: list[Source],
    writers: dict[str, SplitWriter],
    val_fraction: float,
    chunk_chars: int,
    workers: int,
    progress: bool,
    text_key: str,
) -> list[SourceSummary]:
    """Read, encode and append every source to the writers; each source's summary, in order."""
    from tqdm import tqdm

    finished: list[SourceSummary] = []
    pieces = read_pieces(sources, val_fraction, chunk_chars, finished.append, text_key)
    encoded = encode_in_order(batch_tasks(pieces, chunk_chars), workers)
    total_bytes = sum(s.bytes for s in sources)
    try:
        with tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc="tokenizing",
            file=sys.stderr,
            disable=not progress,
        ) as bar:
            for item in encoded:
                writers[item.split].write(item.tokens, item.new_document)
                bar.update(min(round(item.approx_bytes), bar.total - bar.n))
                bar.set_postfix_str(
                    f"{(writers['train'].tokens + writers['val'].tokens) / 1e6:.2f}M tokens",
                    refresh=False,
                )
            bar.update(bar.total - bar.n)
    finally:
        encoded.close()  # stops the worker pool now, also on errors and Ctrl-C
    if len(finished) != len(sources):  # cannot happen: every source was read to its end
        raise RuntimeError(f"{len(finished)} of {len(sources)} sources were read")
    return finished


def _check_counts(
    n_train: int, n_val: int, min_val_tokens: int, val_fraction: float, sources: list[Source]
) -> None:
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


def _meta(
    n_train: int,
    n_val: int,
    val_fraction: float,
    summaries: list[SourceSummary],
    fingerprint: dict[str, str],
    text_key: str,
) -> dict:
    """What meta.json says: the format, the tokenizer, the counts, every source as read."""
    return {
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
        "text_key": text_key,
        "documents": sum(s.documents for s in summaries),
        "sources": [s.to_meta() for s in summaries],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _commit(out_dir: Path, writers: dict[str, SplitWriter], meta: dict, meta_tmp: Path) -> None:
    """Put the new files in place; meta.json last, and none while the .bin files are mixed.
    The marker says so meanwhile: a folder without meta.json is otherwise read as nanoGPT's."""
    text = json.dumps(meta, indent=2) + "\n"
    meta_tmp.write_text(text, encoding="utf-8")
    (out_dir / INCOMPLETE_MARKER).write_text(text, encoding="utf-8")
    (out_dir / "meta.json").unlink(missing_ok=True)
    for writer in writers.values():
        os.replace(writer.tmp, writer.final)
    os.replace(meta_tmp, out_dir / "meta.json")
    (out_dir / INCOMPLETE_MARKER).unlink()


def prepare_dataset(
    inputs: list[Path] | None,
    out_dir: Path,
    val_fraction: float = PrepareOptions.val_fraction,
    num_workers: int | None = PrepareOptions.num_workers,
    min_val_tokens: int | None = None,
    progress: bool = True,
    chunk_chars: int = CHUNK_CHARS,
    block_size: int = PrepareOptions.block_size,
    text_key: str = PrepareOptions.text_key,
    hf_dataset: str | None = None,
    split: str = PrepareOptions.split,
) -> dict:
    """Tokenize ``inputs`` and the ``split`` of ``hf_dataset`` (Tiny Shakespeare when neither is
    given) into ``out_dir``; return the meta.

    ``num_workers``: encoding processes (None: one per CPU, capped by the input size; 0 or 1:
    encode in this process). ``min_val_tokens``: fewest val tokens accepted (default
    ``block_size + 1``, to evaluate one window). ``text_key``: the JSON Lines field / table
    column of the text. Raises DataError naming the file or setting at fault (ConfigError for
    a ``block_size`` below 1).
    """
    min_val_tokens = block_size + 1 if min_val_tokens is None else min_val_tokens
    _check_args(val_fraction, num_workers, min_val_tokens, block_size)
    out_dir = Path(out_dir)
    paths = list(inputs or [])
    if hf_dataset is not None:
        paths += hf_dataset_files(hf_dataset, split, text_key)
    sources = discover_inputs(paths or None)
    fingerprint = tokenizer_fingerprint()
    get_encoding()  # fail on a broken tokenizer before forking workers
    if num_workers is None:
        num_workers = default_num_workers(sum(s.bytes for s in sources), chunk_chars)
    _make_out_dir(out_dir)

    writers: dict[str, SplitWriter] = {}
    meta_tmp = out_dir / f".meta.json.{os.getpid()}.tmp"
    try:
        for split in SPLITS:
            writers[split] = SplitWriter(out_dir, split)
        summaries = _write_tokens(
            sources, writers, val_fraction, chunk_chars, num_workers, progress, text_key
        )
        for writer in writers.values():
            writer.close()
        n_train, n_val = writers["train"].tokens, writers["val"].tokens
        _check_counts(n_train, n_val, min_val_tokens, val_fraction, sources)
        meta = _meta(n_train, n_val, val_fraction, summaries, fingerprint, text_key)
        _commit(out_dir, writers, meta, meta_tmp)
        return meta
    except OSError as e:
        raise DataError(f"cannot write to output folder {out_dir}: {e.strerror or e}") from e
    finally:
        for writer in writers.values():
            writer.file.close()
            writer.tmp.unlink(missing_ok=True)
        meta_tmp.unlink(missing_ok=True)


def prepare_from_options(opts: PrepareOptions) -> dict:
    """`prepare_dataset` as the command line asks for it (tools/prepare_data.py)."""
    return prepare_dataset(
        opts.input,
        opts.out_dir,
        val_fraction=opts.val_fraction,
        num_workers=opts.num_workers,
        progress=not opts.quiet,
        block_size=opts.block_size,
        text_key=opts.text_key,
        hf_dataset=opts.hf_dataset,
        split=opts.split,
    )
