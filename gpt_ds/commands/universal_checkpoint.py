"""Convert a gpt_ds checkpoint into a universal one, loadable on any number of ranks.

    gpt-ds-universal out/                  # the tag `latest` names
    gpt-ds-universal out/ --tag iter_200   # -> prints iter_200_universal

(`python tools/universal_checkpoint.py ...` in a checkout is the same command.)

Training does this by itself when `--resume` finds a checkpoint saved by another world size;
this is the same conversion by hand (DeepSpeed's ds_to_universal, published atomically with
a manifest; see gpt_ds/checkpoint/universal.py). Resume from the result with
`--resume TAG_universal`. Prints the new tag on stdout; on a bad checkpoint prints
`error: ...` and exits 2.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.cli import option, parse, run_tool
from gpt_ds.checkpoint.integrity import ALLOW_HELP
from gpt_ds.checkpoint.tags import resolve
from gpt_ds.checkpoint.universal import convert_to_universal


@dataclass
class UniversalOptions:
    out_dir: Path = option(help="the training run's --out_dir", positional=True)
    tag: str | None = option(None, "checkpoint tag (default: the one `latest` names)")
    allow_unverified: bool = option(False, ALLOW_HELP)


def main(argv: list[str] | None = None) -> int:
    opts = parse(UniversalOptions, argv, description=__doc__)

    def convert() -> int:
        ref = resolve(
            opts.out_dir,
            opts.tag,
            flag="--tag",
            verify=True,
            allow_unverified=opts.allow_unverified,
        )
        print(convert_to_universal(ref).tag)
        return 0

    return run_tool(convert)


if __name__ == "__main__":
    sys.exit(main())
