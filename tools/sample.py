"""`python tools/sample.py ...`: the `gpt-ds-sample` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/sample.py.
"""

import sys

from gpt_ds.commands.sample import main

if __name__ == "__main__":
    sys.exit(main())
