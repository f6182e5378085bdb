"""`gpt_ds.json`, the manifest that makes a checkpoint tag complete: its one reader and writer.

A tag directory is a checkpoint only once its manifest exists (see checkpointer.py for the save
protocol). The manifest says what made the checkpoint (run config, model shape, world size,
ZeRO stage, precision, batch), where training stood (iteration, losses, best tag) and which
files belong to it with their sizes and checksums, so that every reader can check a tag without
loading it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt_ds.model.gpt2 import ModelShape

MANIFEST = "gpt_ds.json"


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` so that a reader sees the old content or the new, never a part."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass(kw_only=True)
class Manifest:
    """The contents of `TAG/gpt_ds.json`."""

    tag: str
    iteration: int
    world_size: int
    zero_stage: int
    model: dict[str, int]  # ModelShape fields
    config: dict[str, Any]  # the RunConfig that made it
    files: dict[str, int]  # file name -> size in bytes, every rank's files
    checksums: dict[str, str] = field(default_factory=dict)  # file name -> hex digest
    checksum_algorithm: str | None = None  # None: saved before gpt_ds recorded checksums
    micro_batch_size: int | None = None  # the batch that made it (None: not recorded)
    grad_accum: int | None = None
    run_id: str | None = None  # the launch that saved it (also in metrics.jsonl)
    precision: str | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    best_tag: str | None = None
    saved_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    universal: bool = False  # made by ds_to_universal, loadable on any world size
    source_tag: str | None = None  # for a universal checkpoint: the tag it was made from
    tokens: int | None = None  # tokens trained on, all ranks (None: saved before it was kept)
    data: dict[str, Any] | None = None  # mixture.DataMix.identity of the data it trained on
    early_stop: dict[str, Any] | None = None  # early_stop.EarlyStop's count and best
    data_stream: str | None = None  # data.TrainWindows.stream; None: saved before, per-rank

    @property
    def tokens_seen(self) -> int | None:
        """Tokens trained on up to this checkpoint: as recorded, else from its batch (exact
        unless an earlier resume changed the batch), else None."""
        if self.tokens is not None:
            return self.tokens
        if self.micro_batch_size is None or self.grad_accum is None:
            return None
        batch = self.micro_batch_size * self.grad_accum * self.world_size
        return self.iteration * batch * int(self.model["block_size"])

    @property
    def shape(self) -> ModelShape:
        return ModelShape(**self.model)

    @classmethod
    def read(cls, tag_dir: Path) -> Manifest | None:
        """The manifest of `tag_dir`, or None when there is none (an incomplete save)."""
        try:
            data = json.loads((Path(tag_dir) / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:  # a required field is missing: not a manifest we wrote
            return None

    def write(self, tag_dir: Path) -> None:
        atomic_write_text(Path(tag_dir) / MANIFEST, json.dumps(self.to_dict(), indent=2))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def same_source(self, other: Manifest) -> bool:
        """True when both describe the same save (a universal copy is of this checkpoint)."""
        keys = ("iteration", "world_size", "zero_stage", "saved_at", "files")
        return all(getattr(self, k) == getattr(other, k) for k in keys)
