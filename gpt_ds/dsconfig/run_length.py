"""How long a run trains: `--max_iters`, or a budget in tokens (`--max_tokens`) or in passes
over the train split (`--max_epochs`), turned into optimizer steps once the batch is known.

A budget is rounded up to whole steps; each launch derives its steps from its own batch, so a
resume with the same batch stops at the same step. The result is the plan's (`RunLength`),
never written back into the run config: a replayed config asks for the same budget again.
Here, beside the DeepSpeed config, because the batch it needs comes from that config and the
schedule it feeds goes back into it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from gpt_ds.base.errors import ConfigError

DEFAULT_MAX_ITERS = 200  # when no flag gives the run's length


class LengthFlags(Protocol):
    """The run config's length flags (run/config.py's RunConfig: frozen, so read-only)."""

    @property
    def max_iters(self) -> int | None: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def max_epochs(self) -> float | None: ...
    @property
    def lr_decay_iters(self) -> int | None: ...


@dataclass(frozen=True)
class RunLength:
    """The run's length in optimizer steps, as planned."""

    max_iters: int  # the step the run trains up to
    decay_iters: int  # where the schedule's decay ends: --lr_decay_iters, else max_iters
    line: str | None = None  # the log line of a budget turned into steps


def has_budget(cfg: LengthFlags) -> bool:
    """Whether the run's length is given in tokens or epochs rather than in steps."""
    return cfg.max_tokens is not None or cfg.max_epochs is not None


def steps_asked(cfg: LengthFlags) -> int:
    """The steps a run without a budget trains for: --max_iters, else the default."""
    return DEFAULT_MAX_ITERS if cfg.max_iters is None else cfg.max_iters


def decay_flag(cfg: LengthFlags) -> str:
    """The flag the schedule's span comes from: --lr_decay_iters, else the run's length flag."""
    if cfg.lr_decay_iters is not None:
        return "--lr_decay_iters"
    if cfg.max_tokens is not None:
        return "--max_tokens"
    return "--max_epochs" if cfg.max_epochs is not None else "--max_iters"


def run_length(cfg: LengthFlags, tokens_per_iter: int, train_tokens: int) -> RunLength:
    """The steps `cfg` asks for; a budget in tokens or epochs becomes whole steps of
    `tokens_per_iter` (all ranks), said in `line`."""
    if not has_budget(cfg):
        iters, line = steps_asked(cfg), None
    else:
        if cfg.max_tokens is not None:
            budget, what = cfg.max_tokens, f"--max_tokens {cfg.max_tokens:,}"
        else:
            assert cfg.max_epochs is not None  # has_budget: one of the two is given
            budget = math.ceil(cfg.max_epochs * train_tokens)
            what = f"--max_epochs {cfg.max_epochs:g} of {train_tokens:,} train tokens"
        iters = math.ceil(budget / tokens_per_iter)
        line = f"run length: {iters:,} iterations from {what} ({tokens_per_iter:,} tokens each)"
        if cfg.lr_decay_iters is not None and cfg.lr_decay_iters > iters:
            raise ConfigError(
                f"--lr_decay_iters {cfg.lr_decay_iters} is beyond the {iters} steps of {what}"
            )
    return RunLength(max_iters=iters, decay_iters=cfg.lr_decay_iters or iters, line=line)
