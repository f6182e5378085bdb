"""`--data_dir DIR[:WEIGHT]`, repeatable: which prepared folders a run trains on, and how much
of each (mixture.py opens them). Pure parsing, so the flag checks run before anything heavy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpt_ds.base.errors import ConfigError

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
