"""Error messages checked by what they name, not by their sentences.

A test asserts the field, flag, file or value at fault and the facts a user acts on (the
numbers that differ, the command that fixes it), so rewording a message breaks no test.
A part is named when it stands whole in the message: not inside a longer name, dotted path
or number ("16" is not named by "160" or "0.16", "overlap_comm" not by "overlap_comms",
"stage" not by "zero_optimization.stage").
"""

from __future__ import annotations

import re


def names(message: str, part: str) -> bool:
    """Whether `message` names `part` whole (see the module's docstring)."""
    pattern = rf"(?<!\w)(?<!\w\.){re.escape(part)}(?!\w)(?!\.\w)"
    return re.search(pattern, message) is not None


def assert_names(message: str, *parts: str) -> None:
    """Every part is named in `message`; a failure lists the missing ones and the message."""
    missing = [part for part in parts if not names(message, part)]
    assert not missing, f"not named: {missing}\nin the message:\n{message}"
