"""The token-file format: written by `gpt_ds.data.prepare.pipeline`, read by `gpt_ds.data.tokens`.

`train.bin`/`val.bin` are flat arrays of GPT-2 token ids of dtype `DTYPE` with no header;
`meta.json` names the format (`FORMAT`, `FORMAT_VERSION`) and the dtype, and records the
inputs it was made from (`rebuild_command`). While gpt_ds.data.prepare.pipeline swaps new files
in, the folder holds `INCOMPLETE_MARKER` (the new meta) and no meta.json: a folder left so by a
crash is
refused, not taken for one of nanoGPT's (which has no meta.json either).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

FORMAT = "gpt_ds.tokens"
FORMAT_VERSION = 1
DTYPE = "uint16"
INCOMPLETE_MARKER = ".prepare_incomplete.json"


def rebuild_command(data_dir: str | Path) -> str:
    """How to re-create the dataset in `data_dir` from its own inputs, as meta.json records
    them: a fix hint must never turn a custom dataset into Tiny Shakespeare by omission."""
    from gpt_ds.data.tokenizer import DEFAULT_CORPUS

    data_dir = Path(data_dir)
    from gpt_ds.base.tool_names import tool

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
