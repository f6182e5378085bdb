"""`python tools/preflight.py ...`: the `gpt-ds-preflight` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/preflight.py.
"""

import sys

from gpt_ds.commands.preflight import main

if __name__ == "__main__":
    sys.exit(main())
