"""Parquet, Arrow, Feather and saved Hugging Face datasets as prepare_data inputs: the same
documents give the same tokens as JSON Lines (and as a plain reference), errors name the file,
the column or the split at fault, and a missing optional package says which extra to install."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt_ds.base.errors import DataError
from gpt_ds.data.prepare.pipeline import prepare_dataset
from gpt_ds.data.tokenizer import EOT_TOKEN, get_encoding
from gpt_ds.data.tokens import rebuild_command

# the `data` extra: a machine without it (a GPU node running `pytest -m gpu`) skips this module
datasets = pytest.importorskip("datasets", reason="the data extra: pip install 'gpt_ds[data]'")
pa = pytest.importorskip("pyarrow", reason="the data extra: pip install 'gpt_ds[data]'")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOCS = [f"Document {i}: {'une phrase, 日本語 😀 ' * (i % 5)}\nline two.  " for i in range(45)]
DOCS[3] = ""  # empty rows are skipped, as an empty JSON Lines text is
DOCS[7] = "spells <|endoftext|> as plain text"
DOCS[11] = "long " * 3000  # more than a chunk: cut into pieces, encoded the same


def reference(docs: list[str], f: float = 0.1) -> tuple[list[int], list[int]]:
    """The documented rule, plainly: non-empty document i to val when floor((i+1)f) > floor(if),
    each encoded alone, EOT between documents."""
    enc, split = get_encoding(), {"train": [], "val": []}
    for i, doc in enumerate(filter(None, docs)):
        tokens = split["val" if math.floor((i + 1) * f) > math.floor(i * f) else "train"]
        tokens += ([EOT_TOKEN] if tokens else []) + enc.encode_ordinary(doc)
    return split["train"], split["val"]


def run(inputs, out_dir: Path, **kwargs) -> dict:
    kwargs = {"num_workers": 0, "min_val_tokens": 1, "progress": False} | kwargs
    return prepare_dataset(inputs, out_dir, chunk_chars=4096, **kwargs)


def split_bytes(out_dir: Path) -> tuple[bytes, bytes]:
    return (out_dir / "train.bin").read_bytes(), (out_dir / "val.bin").read_bytes()


def write_inputs(root: Path) -> dict[str, dict]:
    """The same documents in every form, with the text in column "body" beside an "id"."""
    table = pa.table({"id": list(range(len(DOCS))), "body": DOCS})
    (root / "docs.jsonl").write_text(
        "".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(DOCS))
    )
    pq.write_table(table, root / "docs.parquet", row_group_size=8)
    shards = root / "shards"  # a folder of Parquet shards, read in name order
    shards.mkdir()
    pq.write_table(table.slice(0, 20), shards / "part-0.parquet")
    pq.write_table(table.slice(20), shards / "part-1.parquet")
    feather.write_feather(table, root / "docs.feather", chunksize=9)  # Arrow file format
    with pa.OSFile(str(root / "docs.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table, max_chunksize=6)  # Arrow stream format
    halves = {"train": DOCS, "test": ["other"] * 5}
    dataset = datasets.DatasetDict(
        {k: datasets.Dataset.from_dict({"body": v}) for k, v in halves.items()}
    )
    dataset.save_to_disk(str(root / "hf"))
    forms = {
        name: {"inputs": [root / name]}
        for name in ("docs.parquet", "shards", "docs.feather", "docs.arrow")
    }
    forms["hf_dataset"] = {"inputs": None, "hf_dataset": str(root / "hf"), "split": "train"}
    return forms


def test_tables_give_the_tokens_of_the_same_jsonl(tmp_path):
    forms = write_inputs(tmp_path)
    meta = run([tmp_path / "docs.jsonl"], tmp_path / "jsonl", text_key="body")
    expected = split_bytes(tmp_path / "jsonl")
    train, val = reference(DOCS)
    assert expected == (np.array(train, np.uint16).tobytes(), np.array(val, np.uint16).tobytes())
    assert meta["documents"] == len(DOCS) - 1 and meta["text_key"] == "body"
    assert rebuild_command(tmp_path / "jsonl").endswith(
        "docs.jsonl --text_key body --val_fraction 0.1"
    )
    for name, kwargs in forms.items():
        out = tmp_path / f"out_{name}"
        meta = run(out_dir=out, text_key="body", **kwargs)
        assert split_bytes(out) == expected, name
        assert meta["documents"] == len(DOCS) - 1, name
        for source in meta["sources"]:
            data = Path(source["path"]).read_bytes()
            assert source["sha256"] == hashlib.sha256(data).hexdigest(), name
            assert source["bytes"] == len(data)
    hf_files = [s["path"] for s in meta["sources"]]
    assert [Path(p).relative_to(tmp_path / "hf").parts[0] for p in hf_files] == ["train"]


def test_cli_reads_a_saved_hf_dataset(tmp_path):
    """The flags reach prepare_dataset: --hf_dataset, --split, --text_key."""
    forms = write_inputs(tmp_path)
    out = tmp_path / "cli"
    args = ["--hf_dataset", forms["hf_dataset"]["hf_dataset"], "--split", "train"]
    args += ["--text_key", "body", "--out_dir", str(out), "--block_size", "8", "--quiet"]
    done = subprocess.run(
        [sys.executable, "tools/prepare_data.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    train, val = reference(DOCS)
    assert split_bytes(out) == (
        np.array(train, np.uint16).tobytes(),
        np.array(val, np.uint16).tobytes(),
    )


def test_table_errors_name_the_file_column_or_split(tmp_path, monkeypatch):
    forms = write_inputs(tmp_path)
    pq.write_table(pa.table({"text": ["a", "b", None, "c"]}), tmp_path / "nulls.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 but not really")
    (tmp_path / "broken.arrow").write_bytes(b"not arrow at all")
    hf = forms["hf_dataset"]["hf_dataset"]
    cases = {  # what is given: (inputs, extra kwargs, regex the message must match)
        "no column": (
            [tmp_path / "docs.parquet"],
            {},
            r"docs\.parquet: no column 'text' \(its columns: id, body\); .*--text_key",
        ),
        "not strings": ([tmp_path / "docs.arrow"], {"text_key": "id"}, r"'id' holds int64"),
        "null": ([tmp_path / "nulls.parquet"], {}, r"nulls\.parquet: row 2 \(from 0\): .*null"),
        "parquet": ([tmp_path / "broken.parquet"], {}, r"cannot read .*broken\.parquet as Parq"),
        "arrow": ([tmp_path / "broken.arrow"], {}, r"cannot read .*broken\.arrow as Arrow IPC"),
        "jsonl key": ([tmp_path / "docs.jsonl"], {}, r'"text" field \(its fields: id, body\)'),
        "split": (
            None,
            {"hf_dataset": hf, "split": "validation", "text_key": "body"},
            r"no split 'validation'; it has: train, test\. Pick one with --split",
        ),
        "hf column": (None, {"hf_dataset": hf}, r"no column 'text' \(its columns: body\)"),
        "not saved": (None, {"hf_dataset": str(tmp_path / "shards")}, r"not a folder written by"),
    }
    for name, (inputs, kwargs, pattern) in cases.items():
        with pytest.raises(DataError, match=pattern):
            run(inputs, tmp_path / "out", **kwargs)
        assert not (tmp_path / "out" / "meta.json").exists(), name
    for module in ("pyarrow", "datasets"):  # as if the data extra were not installed
        monkeypatch.setitem(sys.modules, module, None)
    install = r"not installed: pip install 'gpt_ds\[data\]'"
    with pytest.raises(DataError, match=r"reading .*docs\.parquet needs .* pyarrow, .*" + install):
        run([tmp_path / "docs.parquet"], tmp_path / "out")
    with pytest.raises(DataError, match=r"--hf_dataset .* needs .* datasets, .*" + install):
        run(None, tmp_path / "out", hf_dataset=hf)
