"""`python tools/evaluate.py ...`: the `gpt-ds-eval` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/evaluate.py.
"""

import sys

from gpt_ds.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
