"""`python tools/verify_checkpoint.py ...`: the `gpt-ds-verify` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/verify_checkpoint.py.
"""

import sys

from gpt_ds.commands.verify_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
