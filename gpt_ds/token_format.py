"""The token-file format: written by `gpt_ds.prepare`, read by `gpt_ds.data`.

`train.bin`/`val.bin` are flat arrays of GPT-2 token ids of dtype `DTYPE` with no header;
`meta.json` names the format (`FORMAT`, `FORMAT_VERSION`) and the dtype.
"""

from __future__ import annotations

FORMAT = "gpt_ds.tokens"
FORMAT_VERSION = 1
DTYPE = "uint16"
