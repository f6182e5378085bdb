"""Check every node of a DeepSpeed hostfile before a multi-node launch.

    gpt-ds-preflight --hostfile hostfile [--master_addr A] [--master_port P]
        [--expected_devices N] [--checkpoint_dir D] [--min_free_gb G] [--ssh_port P]
        [--timeout S] [--python PATH] [--project_dir DIR]
    gpt-ds-preflight --local [--slots N] [--node_rank R] ...
    ... --burn_in [--burn_in_preset zero2] [--burn_in_model gpt2]   # then the real backend

(`python tools/preflight.py ...` in a checkout is the same command.) Prints a table of hosts x
checks and a `fix:` line per failure; exits 0 when every host is ready, 1 when a check failed,
2 on bad input (a bad hostfile). The checks live in gpt_ds/launch/preflight.py (options:
`PreflightOptions`).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from gpt_ds.base.cli import parse, run_tool
from gpt_ds.launch.checks import format_result
from gpt_ds.launch.preflight import PreflightOptions, burn_in_command, run_preflight

BURN_IN_LIMIT_S = 300  # start-up included; the measuring itself is under a minute


def main(argv: list[str] | None = None) -> int:
    """0: every host ready; 1: some check failed (fix: lines printed); 2: bad input."""
    opts = parse(PreflightOptions, argv)

    def job() -> int:
        result = run_preflight(opts)
        print(format_result(result), flush=True)
        if not result.ok:
            return 1
        return run_burn_in(opts, result) if opts.burn_in else 0

    return run_tool(job)


def run_burn_in(opts: PreflightOptions, result) -> int:
    """Launch the burn-in (its output streams through); 0 when it ran, 1 when it failed."""
    slots = sum(h.slots for h in result.hosts) if opts.local else 0
    checked = dataclasses.replace(opts, master_addr=result.master_addr or opts.master_addr)
    cmd = burn_in_command(checked, max(1, slots))
    print(f"burn-in: {' '.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=opts.project_dir, timeout=BURN_IN_LIMIT_S)
    except subprocess.TimeoutExpired:
        print(f"burn-in: stopped after {BURN_IN_LIMIT_S} s: a rank or link hangs", flush=True)
        return 1
    if proc.returncode != 0:
        print(f"burn-in: the launch failed (exit {proc.returncode}); its output is above")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
