"""What a run says, through one logger, `gpt_ds`: rank 0 tells what happens (INFO and up, or
`--log_level`), every other rank only its warnings and errors, and each rank its one start-up
line (`whole_line`: a missing line is a missing rank). DeepSpeed's and transformers' own
INFO chatter is held at WARNING unless `--log_level debug`.

Every line is written whole, in one write to the stream: under the launcher all ranks share
one pipe, where `print`'s separate writes of text and newline let two ranks' text run into
one line. Messages are printed as they are (no prefix of level or time): tests and users read
the lines themselves; `error:` lines of refusals are the entry point's, unchanged.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LOGGER_NAME = "gpt_ds"
LEVELS = ("debug", "info", "warning", "error")
LIBRARIES = ("DeepSpeed", "transformers")  # their loggers, quiet unless --log_level debug


def whole_line(text: str, stream: TextIO | None = None) -> None:
    """`text` and its newline in one write, flushed (stdout unless `stream`)."""
    out = stream or sys.stdout
    out.write(text + "\n")
    out.flush()


class _WholeLines(logging.Handler):
    """Each record as one whole line on sys.stdout as it is at the time (a test's capture
    included)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            whole_line(self.format(record))
        except Exception:  # a closed stream at exit: logging's own reporting
            self.handleError(record)


def _logger() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _WholeLines) for h in logger.handlers):
        logger.addHandler(_WholeLines())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


LOGGER = _logger()  # INFO on every process until `configure` says who speaks
_libraries = {"level": logging.WARNING}


def configure(level: str, rank: int) -> None:
    """Rank 0 logs from `level` up, the other ranks warnings and errors; DeepSpeed's and
    transformers' loggers at WARNING unless `level` is debug (`quiet_libraries`)."""
    threshold = logging.getLevelName(level.upper())
    LOGGER.setLevel(threshold if rank == 0 else max(threshold, logging.WARNING))
    _libraries["level"] = logging.DEBUG if level == "debug" else logging.WARNING
    quiet_libraries()


def quiet_libraries() -> None:
    """DeepSpeed's and transformers' loggers to the level `configure` chose. DeepSpeed sets
    its logger's level when imported: called again once it is (base/dist.py `init`)."""
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(_libraries["level"])
