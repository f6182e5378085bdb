"""Plot training runs from OUT_DIR/metrics.jsonl (see gpt_ds/commands/plot_metrics.py).

python tools/plot_metrics.py out/shakespeare --output loss.png
"""

from __future__ import annotations

import sys

from gpt_ds.commands.plot_metrics import main

if __name__ == "__main__":
    sys.exit(main())
