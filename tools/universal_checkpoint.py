"""Convert a gpt_ds checkpoint into a universal one, loadable on any number of ranks.

    python tools/universal_checkpoint.py out/                  # the tag `latest` names
    python tools/universal_checkpoint.py out/ --tag iter_200   # -> prints iter_200_universal

Training does this by itself when `--resume` finds a checkpoint saved by another world size;
this is the same conversion by hand (DeepSpeed's ds_to_universal, published atomically with
a manifest; see gpt_ds/checkpoint.py). Resume from the result with `--resume TAG_universal`.
Prints the new tag on stdout; on a bad checkpoint prints `error: ...` and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt_ds.checkpoint import Checkpointer, convert_to_universal
from gpt_ds.errors import CheckpointError, GptDsError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out_dir", type=Path, help="the training run's --out_dir")
    p.add_argument(
        "--tag", default="latest", help="checkpoint tag (default: the one `latest` names)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ckpt = Checkpointer(args.out_dir)
    tag = ckpt.latest_tag() if args.tag == "latest" else args.tag
    try:
        if tag is None:
            have = ", ".join(ckpt.complete_tags()) or "none"
            raise CheckpointError(
                f"{args.out_dir}: no `latest` file names a checkpoint; give --tag "
                f"(complete tags: {have})"
            )
        print(convert_to_universal(args.out_dir, tag))
    except GptDsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
