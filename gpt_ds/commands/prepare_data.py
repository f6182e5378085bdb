"""Tokenize text into train.bin / val.bin / meta.json for gpt_ds (GPT-2 BPE, uint16).

    gpt-ds-prepare                                                # Tiny Shakespeare
    gpt-ds-prepare --input books/ extra.jsonl --out_dir data/mine

(`python tools/prepare_data.py ...` in a checkout is the same command.) Inputs, the train/val
split rule and the output format are described in gpt_ds/data/prepare/pipeline.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gpt_ds.base.cli import parse, run_tool
from gpt_ds.data.prepare.pipeline import PrepareOptions, prepare_from_options


def summary(meta: dict, out_dir: Path, seconds: float) -> str:
    total = meta["train_tokens"] + meta["val_tokens"]
    rows = [
        ("output", f"{out_dir}/{{train.bin,val.bin,meta.json}}"),
        ("files", f"{len(meta['sources']):,}"),
        ("documents", f"{meta['documents']:,}"),
        ("input bytes", f"{sum(s['bytes'] for s in meta['sources']):,}"),
        ("train tokens", f"{meta['train_tokens']:,}"),
        ("val tokens", f"{meta['val_tokens']:,} ({meta['val_tokens'] / total:.2%})"),
        ("total tokens", f"{total:,}"),
        ("time", f"{seconds:.2f} s"),
        ("tokens/s", f"{total / max(seconds, 1e-9):,.0f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    opts = parse(PrepareOptions, argv, description=__doc__)

    def job() -> None:
        start = time.perf_counter()
        meta = prepare_from_options(opts)
        print(summary(meta, opts.out_dir, time.perf_counter() - start))

    return run_tool(job, interrupted="interrupted: nothing was written")


if __name__ == "__main__":
    sys.exit(main())
