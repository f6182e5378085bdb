"""What of a run costs memory besides the model: the zero_optimization sizes (`ZeroSettings`,
from a DeepSpeed config or preset) and the run itself (`DeepSpeedRun`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from gpt_ds.dsconfig.resolve import ResolvedDsConfig


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


@dataclass(frozen=True)
class DeepSpeedRun:
    """What of one DeepSpeed run decides its memory, besides the model's shape: the input of
    `estimate_run`, built by the trainer's plan (`from_resolved`), the picker and the tests."""

    zero_stage: int
    offload_optimizer: bool
    offload_param: bool
    world_size: int
    gpus_per_node: int
    micro_batch_size: int
    precision: str
    activation_checkpointing: bool
    chunked_loss: bool = False
    """The LM loss is computed in chunks (--loss chunked): no full logits (activations.py)."""
    zero: ZeroSettings = ZeroSettings()
    """Bucket, prefetch and persistence sizes; DeepSpeed 0.19's defaults unless given."""
    rank: int | None = None
    """The rank to describe; None: the one holding the most (ZeRO-2 ranks differ slightly)."""

    @classmethod
    def from_resolved(
        cls,
        resolved: ResolvedDsConfig,
        *,
        world_size: int,
        gpus_per_node: int,
        activation_checkpointing: bool,
        chunked_loss: bool,
    ) -> DeepSpeedRun:
        """The run a resolved DeepSpeed config describes, on `world_size` ranks."""
        zero = resolved.config.get("zero_optimization", {})
        return cls(
            zero_stage=resolved.zero_stage,
            offload_optimizer=zero.get("offload_optimizer", {}).get("device", "none") != "none",
            offload_param=zero.get("offload_param", {}).get("device", "none") != "none",
            world_size=world_size,
            gpus_per_node=gpus_per_node,
            micro_batch_size=resolved.micro_batch_size,
            precision=resolved.precision,
            activation_checkpointing=activation_checkpointing,
            chunked_loss=chunked_loss,
            zero=ZeroSettings.from_ds_config(zero),
        )
