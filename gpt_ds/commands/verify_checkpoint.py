"""Check a training run's checkpoints without loading them: files, sizes and checksums.

    gpt-ds-verify out/                 # every complete tag
    gpt-ds-verify out/ --tag iter_200  # one tag (or pass its directory)

(`python tools/verify_checkpoint.py ...` in a checkout is the same command.) Prints one row per tag
and names every damaged file. Exit 0 when everything checked is intact, 1 when something is damaged,
2 when there is nothing to check (`error: ...`). Training (`--resume`) and export verify the tag
they load the same way, by themselves.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.cli import option, parse, run_tool
from gpt_ds.checkpoint.audit import audit_lines, audit_run


@dataclass
class VerifyOptions:
    out_dir: Path = option(
        help="the training run's --out_dir, or one tag directory", positional=True
    )
    tag: str | None = option(None, "check only this tag (default: every complete tag)")


def main(argv: list[str] | None = None) -> int:
    opts = parse(VerifyOptions, argv, description=__doc__)

    def verify() -> int:
        out_dir, audits = audit_run(opts.out_dir, opts.tag)
        print("\n".join(audit_lines(out_dir, audits)))
        damaged = [a.tag for a in audits if not a.ok]
        if damaged:
            print(f"damaged: {', '.join(damaged)}; do not resume or export these tags")
        return 1 if damaged else 0

    return run_tool(verify)


if __name__ == "__main__":
    sys.exit(main())
