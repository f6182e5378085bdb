"""`python tools/pick_preset.py ...`: the `gpt-ds-pick-preset` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/pick_preset.py.
"""

import sys

from gpt_ds.commands.pick_preset import main

if __name__ == "__main__":
    sys.exit(main())
