"""Check every node of a DeepSpeed hostfile before a multi-node launch.

    python tools/preflight.py --hostfile hostfile [--master_addr A] [--master_port P]
        [--expected_devices N] [--checkpoint_dir D] [--min_free_gb G] [--ssh_port P]
        [--timeout S] [--python PATH] [--project_dir DIR]
    python tools/preflight.py --local [--slots N] [--node_rank R] ...

Prints a table of hosts x checks and a `fix:` line per failure; exits 0 when every host is
ready, 1 when a check failed, 2 on bad input (a bad hostfile). The logic lives in
gpt_ds/preflight.py (options: `PreflightOptions`).
"""

from __future__ import annotations

import sys

from gpt_ds.preflight import main

if __name__ == "__main__":
    sys.exit(main())
