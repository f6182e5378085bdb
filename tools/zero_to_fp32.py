"""`python tools/zero_to_fp32.py ...`: the `gpt-ds-export` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/zero_to_fp32.py.
"""

import sys

from gpt_ds.commands.zero_to_fp32 import main

if __name__ == "__main__":
    sys.exit(main())
