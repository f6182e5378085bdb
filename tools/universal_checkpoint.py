"""`python tools/universal_checkpoint.py ...`: the `gpt-ds-universal` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/universal_checkpoint.py.
"""

import sys

from gpt_ds.commands.universal_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
