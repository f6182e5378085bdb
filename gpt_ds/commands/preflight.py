"""Check every node of a DeepSpeed hostfile before a multi-node launch.

    gpt-ds-preflight --hostfile hostfile [--master_addr A] [--master_port P]
        [--expected_devices N] [--checkpoint_dir D] [--min_free_gb G] [--ssh_port P]
        [--timeout S] [--python PATH] [--project_dir DIR]
    gpt-ds-preflight --local [--slots N] [--node_rank R] ...

(`python tools/preflight.py ...` in a checkout is the same command.) Prints a table of hosts x
checks and a `fix:` line per failure; exits 0 when every host is ready, 1 when a check failed,
2 on bad input (a bad hostfile). The checks live in gpt_ds/launch/preflight.py (options:
`PreflightOptions`).
"""

from __future__ import annotations

import sys

from gpt_ds.base.cli import parse, run_tool
from gpt_ds.launch.checks import format_result
from gpt_ds.launch.preflight import PreflightOptions, run_preflight


def main(argv: list[str] | None = None) -> int:
    """0: every host ready; 1: some check failed (fix: lines printed); 2: bad input."""
    opts = parse(PreflightOptions, argv)

    def job() -> int:
        result = run_preflight(opts)
        print(format_result(result), flush=True)
        return 0 if result.ok else 1

    return run_tool(job)


if __name__ == "__main__":
    sys.exit(main())
