"""The zero_optimization settings that cost memory, read from a DeepSpeed config or preset."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ZeroSettings:
    """The zero_optimization settings that cost memory, with DeepSpeed 0.19's defaults."""

    reduce_bucket_size: int = 500_000_000
    """Elements per gradient-reduction bucket (ZeRO-1/2/3)."""
    allgather_bucket_size: int = 500_000_000
    """Elements per ZeRO-1/2 all-gather shard. Costs no memory in DeepSpeed 0.19: it gathers in
    place into the flat 16-bit buffer (all_gather_into_tensor)."""
    overlap_comm: bool | None = None
    """Double-buffer the reduction bucket. None: DeepSpeed's default (on for ZeRO-3 only)."""
    prefetch_bucket_size: int = 50_000_000
    """ZeRO-3: elements of parameters gathered ahead of use."""
    param_persistence_threshold: int = 100_000
    """ZeRO-3: parameters of at most this many elements stay whole on every rank."""
    model_persistence_threshold: int = sys.maxsize
    """ZeRO-3: cap on the total elements kept whole."""
    max_live_parameters: int = 1_000_000_000
    """ZeRO-3: cap on gathered elements alive at once."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3: elements per optimizer sub-group (bounds the fp32 gradient made per step)."""

    _DS_KEYS = {
        "reduce_bucket_size": "reduce_bucket_size",
        "allgather_bucket_size": "allgather_bucket_size",
        "overlap_comm": "overlap_comm",
        "prefetch_bucket_size": "stage3_prefetch_bucket_size",
        "param_persistence_threshold": "stage3_param_persistence_threshold",
        "model_persistence_threshold": "stage3_model_persistence_threshold",
        "max_live_parameters": "stage3_max_live_parameters",
        "sub_group_size": "sub_group_size",
    }

    @classmethod
    def from_ds_config(cls, zero_section: dict[str, Any] | None) -> ZeroSettings:
        """Settings from a DeepSpeed `zero_optimization` section; "auto" or absent: defaults."""
        values: dict[str, Any] = {}
        for name, ds_key in cls._DS_KEYS.items():
            plain = ds_key.removeprefix("stage3_")
            for key in (ds_key, plain):
                v = (zero_section or {}).get(key)
                if isinstance(v, bool) and name == "overlap_comm":
                    values[name] = v
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    values[name] = int(v)
        return cls(**values)

    def overlap(self, zero_stage: int) -> bool:
        return self.overlap_comm if self.overlap_comm is not None else zero_stage == 3


def load_preset_settings(preset: str | Path) -> ZeroSettings:
    """ZeroSettings of a ds_configs/ preset file; DeepSpeed's defaults if it is missing."""
    path = Path(preset)
    if not path.is_file():
        return ZeroSettings()
    return ZeroSettings.from_ds_config(json.loads(path.read_text()).get("zero_optimization"))
