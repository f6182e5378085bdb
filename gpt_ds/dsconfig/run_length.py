"""How long a run trains: `--max_iters`, or a budget in tokens (`--max_tokens`) or in passes
over the train split (`--max_epochs`), turned into optimizer steps once the batch is known.

A budget is rounded up to whole steps; each launch derives its steps from its own batch, so a
resume with the same batch stops at the same step. Here, beside the DeepSpeed config, because
the batch it needs comes from that config and the schedule it feeds goes back into it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol, TypeVar

from gpt_ds.base.errors import ConfigError


class RunLength(Protocol):
    """The run config's length flags (run/config.py's RunConfig, a dataclass)."""

    max_iters: int
    max_tokens: int | None
    max_epochs: float | None
    lr_decay_iters: int | None


Config = TypeVar("Config", bound=RunLength)


def has_budget(cfg: RunLength) -> bool:
    """Whether the run's length is given in tokens or epochs rather than in steps."""
    return cfg.max_tokens is not None or cfg.max_epochs is not None


def with_budget(cfg: Config, tokens_per_iter: int, train_tokens: int) -> tuple[Config, str]:
    """`cfg` with max_iters from its token or epoch budget, and the log line saying so."""
    if cfg.max_tokens is not None:
        budget, what = cfg.max_tokens, f"--max_tokens {cfg.max_tokens:,}"
    else:
        budget = math.ceil(cfg.max_epochs * train_tokens)
        what = f"--max_epochs {cfg.max_epochs:g} of {train_tokens:,} train tokens"
    iters = math.ceil(budget / tokens_per_iter)
    if cfg.lr_decay_iters is not None and cfg.lr_decay_iters > iters:
        raise ConfigError(
            f"--lr_decay_iters {cfg.lr_decay_iters} is beyond the {iters} steps of {what}"
        )
    line = f"run length: {iters:,} iterations from {what} ({tokens_per_iter:,} tokens each)"
    return dataclasses.replace(cfg, max_iters=iters), line
