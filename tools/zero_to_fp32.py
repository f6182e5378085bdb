"""`python tools/zero_to_fp32.py ...`: the `gpt-ds-export` command, run from a checkout.

Its code and `--help` are in gpt_ds/commands/export.py. (The script keeps the name users and
DeepSpeed know it by; the command module is named for what it does.)
"""

import sys

from gpt_ds.commands.export import main

if __name__ == "__main__":
    sys.exit(main())
