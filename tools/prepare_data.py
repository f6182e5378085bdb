"""Tokenize text into train.bin / val.bin / meta.json for gpt_ds (GPT-2 BPE, uint16).

    python tools/prepare_data.py                                  # Tiny Shakespeare
    python tools/prepare_data.py --input books/ extra.jsonl --out_dir data/mine

Inputs, the train/val split rule and the output format are described in gpt_ds/prepare.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpt_ds.errors import ConfigError, GptDsError
from gpt_ds.prepare import DEFAULT_BLOCK_SIZE, prepare_dataset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--input",
        nargs="+",
        type=Path,
        default=None,
        metavar="PATH",
        help="text files, .jsonl files ({'text': ...} per line) or folders of them "
        "(default: the embedded Tiny Shakespeare)",
    )
    p.add_argument("--out_dir", type=Path, default=Path("data/shakespeare"))
    p.add_argument("--val_fraction", type=float, default=0.1, help="share held out for val")
    p.add_argument(
        "--num_workers",
        type=int,
        default=None,
        help="encoding processes (default: one per CPU, capped by the input size; 0: none)",
    )
    p.add_argument(
        "--block_size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help="context length you will train with: val must hold at least block_size + 1 tokens",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


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
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        if args.block_size < 1:
            raise ConfigError(f"--block_size must be >= 1, got {args.block_size}")
        meta = prepare_dataset(
            args.input,
            args.out_dir,
            val_fraction=args.val_fraction,
            num_workers=args.num_workers,
            min_val_tokens=args.block_size + 1,
            progress=not args.quiet,
        )
    except GptDsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130
    print(summary(meta, args.out_dir, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
