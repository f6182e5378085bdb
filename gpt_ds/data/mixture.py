"""Training data from one prepared folder or a weighted mixture of several.

    --data_dir web:0.7 --data_dir books:0.3      # 70% / 30% of the training sequences
    --data_dir web --data_dir books              # in proportion to their train tokens

`DataMix` holds the sources (each a checked `TokenData`; `data_specs` parses the flag), their
names (the folder names) and normalised weights. `MixtureWindows` extends the per-sequence
stream of data.TrainWindows: sequence i of a rank's stream takes its source from a second word
of the same Philox block that places its window, so the draw is reproducible, independent of
the micro-batch split, and the stream's state is still one integer. Evaluation scores every
source's val split; the run's val loss is their weighted mean (trainer.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt_ds.base.errors import ConfigError
from gpt_ds.data.tokens import GlobalSplit, TokenData, TrainWindows, load_token_data, xy_batch

# `--data_dir DIR[:WEIGHT]`, repeatable: which prepared folders a run trains on, and how much
# of each (mixture.py opens them). Pure parsing, so the flag checks run before anything heavy.

DEFAULT_DATA_DIR = "data/shakespeare"


@dataclass(frozen=True)
class DataSpec:
    """One `--data_dir DIR[:WEIGHT]`."""

    path: str
    weight: float | None

    @classmethod
    def parse(cls, text: str) -> DataSpec:
        head, sep, tail = text.rpartition(":")
        if not sep or Path(text).exists():
            return cls(text, None)
        try:
            weight = float(tail)
        except ValueError:
            return cls(text, None)  # a ':' that is part of the path
        if not weight > 0:
            raise ConfigError(f"--data_dir {text}: the weight must be > 0, got {tail}")
        return cls(head, weight)


def data_specs(data_dir: list[str] | str | None) -> list[DataSpec]:
    """The run's `--data_dir` values (a saved run's config may hold one string)."""
    values = [data_dir] if isinstance(data_dir, str) else list(data_dir or [DEFAULT_DATA_DIR])
    specs = [DataSpec.parse(v) for v in values]
    weighted = [s.weight is not None for s in specs]
    if any(weighted) and not all(weighted):
        raise ConfigError(
            "--data_dir: give every source a weight (DIR:WEIGHT) or none (weights by size): "
            + ", ".join(values)
        )
    names = [Path(s.path).name for s in specs]
    if len(set(names)) < len(names):
        raise ConfigError(f"--data_dir: two sources share a folder name: {', '.join(values)}")
    return specs


@dataclass(frozen=True)
class DataMix:
    names: list[str]
    sources: list[TokenData]
    weights: list[float]  # normalised: sum 1

    @property
    def train_tokens(self) -> int:
        return sum(len(s.train) for s in self.sources)

    @property
    def val_tokens(self) -> int:
        return sum(len(s.val) for s in self.sources)

    @property
    def is_mixture(self) -> bool:
        return len(self.sources) > 1

    def identity(self) -> dict[str, Any]:
        """What a checkpoint records of its data: each source's split sizes and input
        checksums (from meta.json), and for a mixture the names and weights."""
        ids = [_identity(s.meta) for s in self.sources]
        if not self.is_mixture:
            return ids[0]
        return {
            "mixture": [
                {"name": n, "weight": round(w, 12), **i}
                for n, w, i in zip(self.names, self.weights, ids, strict=True)
            ]
        }

    def describe(self) -> str:
        return ", ".join(
            f"{n} {w:.0%} ({len(s.train):,} train tokens)"
            for n, w, s in zip(self.names, self.weights, self.sources, strict=True)
        )


def _identity(meta: dict) -> dict[str, Any]:
    return {
        "train_tokens": meta.get("train_tokens"),
        "val_tokens": meta.get("val_tokens"),
        "sources": [s.get("sha256") for s in meta.get("sources", [])],
    }


def load_mix(data_dir: list[str] | str | None, vocab_size: int, block_size: int) -> DataMix:
    """Every source opened and checked (data.load_token_data), its weight normalised."""
    specs = data_specs(data_dir)
    sources = [load_token_data(s.path, vocab_size, block_size) for s in specs]
    raw = [
        s.weight if s.weight is not None else len(d.train)
        for s, d in zip(specs, sources, strict=True)
    ]
    total = float(sum(raw))
    return DataMix(
        names=[Path(s.path).name for s in specs],
        sources=sources,
        weights=[w / total for w in raw],
    )


class MixtureWindows(TrainWindows):
    """The training windows a rank draws, from several sources in proportion to their
    weights: sequence i's source and window are both drawn at counter i of the stream."""

    def __init__(
        self, mix: DataMix, block_size: int, batch_size: int, seed: int, rank: int,
        split: GlobalSplit,
    ):  # fmt: skip
        super().__init__(mix.sources[0].train, block_size, batch_size, seed, rank, split)
        self.per_source = [  # each scales a draw to its own length (offsets only)
            TrainWindows(s.train, block_size, batch_size, seed, rank, split) for s in mix.sources
        ]
        self.bounds = np.cumsum(mix.weights)[:-1]  # source k: unit in [bounds[k-1], bounds[k])

    def sources(self, first: int, count: int) -> np.ndarray:
        """The source index of sequences first .. first + count - 1 of this stream."""
        return np.searchsorted(self.bounds, self.units(first, count, word=1), side="right")

    def picks(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(source, window offset in it) of sequences first .. first + count - 1."""
        picks, unit = self.sources(first, count), self.units(first, count)
        starts = np.stack([s.offsets(unit) for s in self.per_source])
        return picks, starts[picks, np.arange(count)]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        picks, starts = self.picks(self.take(), self.batch_size)
        windows = [
            self.per_source[k].tokens[start : start + self.block_size + 1]
            for k, start in zip(picks, starts, strict=True)
        ]
        return xy_batch(windows)

    def step_signature(self, first: int, count: int) -> np.ndarray:
        return np.concatenate(self.picks(first, count))
