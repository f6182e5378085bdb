"""Parquet, Arrow/Feather and Hugging Face datasets as inputs of `gpt_ds.data.prepare.pipeline`.

Every row of a table is one document, taken from the column `--text_key` names and read one
record batch at a time (never the whole table in memory). `table_documents` yields documents as
JSON Lines files yield theirs, so the same documents give the same tokens in either form. A
Hugging Face dataset (`--hf_dataset`) is read through the Arrow files it is stored in: those of
a `save_to_disk` folder, or the cache `load_dataset` fills. pyarrow and datasets are optional
(`pip install 'gpt_ds[data]'`) and imported only when such an input is given.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from gpt_ds.base.errors import DataError

TABLE_SUFFIXES = (".parquet", ".arrow", ".feather")
BATCH_ROWS = 1024  # rows converted to Python strings at a time: memory bounded by the batch
INSTALL = "pip install 'gpt_ds[data]' (in a checkout: pip install -e '.[data]')"


def require(module: str, needed_by: str) -> ModuleType:
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(
            f"{needed_by} needs the Python package {module}, which is not installed: {INSTALL}"
        ) from None


# --------------------------------------------------------------------------- table files


def _check_column(path: Path, schema, key: str) -> int:
    """The index of the text column in ``schema``; a DataError unless it holds strings."""
    import pyarrow as pa

    if key not in schema.names:
        raise DataError(
            f"{path}: no column {key!r} (its columns: {', '.join(schema.names)}); "
            "name the column that holds the text with --text_key"
        )
    kind = schema.field(key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(
            f"{path}: column {key!r} holds {kind}, not strings; "
            "name the column that holds the text with --text_key"
        )
    return schema.get_field_index(key)


def _ipc_open(pa: ModuleType, source) -> tuple:
    """(schema, record batches) of an Arrow IPC file of either layout: the file format (Feather
    v2) or the stream format (what `datasets` writes)."""
    try:
        reader = pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        reader = pa.ipc.open_stream(source)
        return reader.schema, iter(reader)
    return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))


def _columns(path: Path, key: str) -> Iterator:
    """The text column of ``path``, in slices of at most `BATCH_ROWS` rows."""
    pa = require("pyarrow", f"reading {path}")
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        _check_column(path, table.schema_arrow, key)
        for batch in table.iter_batches(batch_size=BATCH_ROWS, columns=[key]):
            yield batch.column(0)
        return
    with pa.memory_map(str(path)) as source:
        schema, batches = _ipc_open(pa, source)
        index = _check_column(path, schema, key)
        for batch in batches:
            for start in range(0, batch.num_rows, BATCH_ROWS):
                yield batch.column(index).slice(start, BATCH_ROWS)


def row_count(path: Path) -> int:
    """Rows of a table file: from its footer (Parquet, Arrow file), else from batch headers."""
    pa = require("pyarrow", f"reading {path}")
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        with pa.memory_map(str(path)) as source:
            return sum(batch.num_rows for batch in _ipc_open(pa, source)[1])
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, e) from e


def _unreadable(path: Path, e: Exception) -> DataError:
    kind = "Parquet" if path.suffix.lower() == ".parquet" else "Arrow IPC (file or stream)"
    return DataError(f"cannot read {path} as {kind}: {e}")


def table_documents(path: Path, key: str, sha256) -> Iterator[tuple[str, float]]:
    """``(text, approx input bytes)`` for each non-empty row of ``path``, in order; the file's
    bytes go into ``sha256``. A null value is an error, as a JSON Lines ``null`` is."""
    import pyarrow as pa

    _hash_file(path, sha256)
    per_row = path.stat().st_size / max(row_count(path), 1)
    row = 0
    try:
        for column in _columns(path, key):
            texts = column.to_pylist()
            if None in texts:
                raise DataError(
                    f"{path}: row {row + texts.index(None)} (from 0): {key!r} is null; "
                    "expected a string (drop or fill the rows without text)"
                )
            for text in texts:
                if text:
                    yield text, per_row
            row += len(texts)
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, e) from e


def _hash_file(path: Path, sha256) -> None:
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha256.update(block)
    except OSError as e:
        raise DataError(f"cannot read input file {path}: {e.strerror or e}") from e


# --------------------------------------------------------------------------- Hugging Face


def _load_hf(datasets: ModuleType, name: str, split: str):
    """A saved folder (Dataset, or DatasetDict: ``split`` picks one), else a hub dataset."""
    if not Path(name).exists():
        try:
            return datasets.load_dataset(name, split=split)
        except (OSError, ValueError) as e:
            raise DataError(
                f"--hf_dataset {name}: not a folder here, and loading it from the Hugging Face "
                f"Hub failed ({type(e).__name__}: {e}). Check the name and --split, or where "
                "the hub is reachable save it with datasets' save_to_disk and pass that folder"
            ) from e
    try:
        loaded = datasets.load_from_disk(name)
    except (OSError, ValueError) as e:
        raise DataError(
            f"--hf_dataset {name}: not a folder written by datasets' save_to_disk ({e}); "
            "pass folders of Parquet, Arrow or JSON Lines files with --input instead"
        ) from e
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(
                f"--hf_dataset {name}: no split {split!r}; it has: {', '.join(loaded)}. "
                "Pick one with --split"
            )
        return loaded[split]
    return loaded


def hf_dataset_files(name: str, split: str, key: str) -> list[Path]:
    """The Arrow files that hold one split of a Hugging Face dataset, in row order."""
    datasets = require("datasets", f"--hf_dataset {name}")
    dataset = _load_hf(datasets, name, split)
    if key not in dataset.column_names:
        raise DataError(
            f"--hf_dataset {name}: no column {key!r} (its columns: "
            f"{', '.join(dataset.column_names)}); name the text column with --text_key"
        )
    files = [Path(f["filename"]) for f in dataset.cache_files]
    rows = sum(row_count(f) for f in files)
    if not files or getattr(dataset, "_indices", None) is not None or rows != dataset.num_rows:
        raise DataError(
            f"--hf_dataset {name}: its {dataset.num_rows:,} rows are not its Arrow files as "
            f"stored ({len(files)} files, {rows:,} rows: held in memory, a slice or a "
            "selection). Save the rows you want with save_to_disk and pass that folder"
        )
    return files
