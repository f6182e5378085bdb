"""`python tools/prepare_data.py ...`: the `gpt-ds-prepare` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/prepare_data.py.
"""

import sys

from gpt_ds.commands.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
