"""This machine's facts (gpt_ds/launch/machine.py), probed once per test process: what the tests
that resolve a DeepSpeed config alone hand to `resolve_ds_config`, as the trainer does."""

from __future__ import annotations

import functools

from gpt_ds.dsconfig.settings import MachineFacts
from gpt_ds.launch.machine import probe_machine


@functools.cache
def here() -> MachineFacts:
    return probe_machine()
