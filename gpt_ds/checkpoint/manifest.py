"""`gpt_ds.json`, the manifest that makes a checkpoint tag complete: its one reader and writer.

A tag directory is a checkpoint only once its manifest exists (see checkpointer.py for the save
protocol). The manifest says what made the checkpoint (run config, model shape, world size,
ZeRO stage, precision, batch), where training stood (iteration, losses, best tag) and which
files belong to it with their sizes and checksums, so that every reader can check a tag without
loading it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt_ds.base.errors import CheckpointError
from gpt_ds.data.tokens import STREAM
from gpt_ds.dsconfig.optimization import optimizer_type
from gpt_ds.model.gpt2 import ModelShape

MANIFEST = "gpt_ds.json"
FORMAT_VERSION = 2  # of the manifest's layout; `migrate` reads every earlier one


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` so that a reader sees the old content or the new, never a part."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass(kw_only=True)
class Manifest:
    """The contents of `TAG/gpt_ds.json`."""

    tag: str
    format_version: int = FORMAT_VERSION
    iteration: int
    world_size: int
    zero_stage: int
    model: dict[str, int]  # ModelShape fields
    config: dict[str, Any]  # the run config that made it: the flags as the user gave them
    files: dict[str, int]  # file name -> size in bytes, every rank's files
    checksums: dict[str, str] = field(default_factory=dict)  # file name -> hex digest
    checksum_algorithm: str | None = None  # None: no checksums (older gpt_ds, or edited)
    micro_batch_size: int | None = None  # the batch that made it (None: never recorded)
    grad_accum: int | None = None
    run_id: str | None = None  # the launch that saved it (also in metrics.jsonl)
    precision: str | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    best_tag: str | None = None
    saved_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    universal: bool = False  # made by ds_to_universal, loadable on any world size
    source_tag: str | None = None  # for a universal checkpoint: the tag it was made from
    source_digest: str | None = None  # for a universal checkpoint: its source's `digest()`
    tokens: int | None = None  # tokens trained on, all ranks (None: its batch never recorded)
    data: dict[str, Any] | None = None  # mixture.DataMix.identity (None: never recorded)
    early_stop: dict[str, Any] | None = None  # training/trainer.py EarlyStop's count and best
    data_stream: str = STREAM  # how windows were drawn; "per_rank": not resumable (batch.py)
    plan: dict[str, Any] | None = None  # what the run computed from its config (RunPlan.record)

    @property
    def shape(self) -> ModelShape:
        return ModelShape(**self.model)

    @property
    def optimizer(self) -> str | None:
        """The optimizer type that saved it ("adamw", "muon"), from the plan (the DeepSpeed
        config's for manifests before the plan named it); None where neither says."""
        plan = self.plan or {}
        if plan.get("optimizer"):
            return plan["optimizer"]
        return optimizer_type((plan.get("deepspeed_config") or {}).get("optimizer"))

    @classmethod
    def read(cls, tag_dir: Path) -> Manifest | None:
        """The manifest of `tag_dir`, or None when there is none (an incomplete save)."""
        try:
            data = json.loads((Path(tag_dir) / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if not isinstance(data, dict) or not data.keys() >= _REQUIRED:
            return None  # not a manifest we wrote
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in migrate(data, tag_dir).items() if k in known})

    def write(self, tag_dir: Path) -> None:
        atomic_write_text(Path(tag_dir) / MANIFEST, json.dumps(self.to_dict(), indent=2))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """One SHA-256 over the file names and checksums: which bytes this save holds."""
        listing = json.dumps(sorted(self.checksums.items()) or sorted(self.files.items()))
        return hashlib.sha256(listing.encode()).hexdigest()

    def converted_from(self, source: Manifest) -> bool:
        """True when this universal checkpoint was made from `source`, as it is now (`final`
        is rewritten by every run that ends)."""
        return self.universal and self.source_digest == source.digest()


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What every manifest of one launch says of the run that made it, fixed for the launch
    (run/plan.py `RunPlan.run_record`): world size, ZeRO stage, model, the run config as given
    and what was computed from it, precision, batch split, run id and data."""

    world_size: int
    zero_stage: int
    model: dict[str, int]
    config: dict[str, Any]
    plan: dict[str, Any]
    precision: str
    micro_batch_size: int
    grad_accum: int
    run_id: str
    data: dict[str, Any]


def new_manifest(
    run: RunRecord,
    *,
    tag: str,
    iteration: int,
    tokens: int,
    val_loss: float | None,
    best_val_loss: float | None,
    best_tag: str | None,
    early_stop: dict[str, Any],
) -> Manifest:
    """The manifest of a save at `iteration` (its files are the checkpointer's to add): the
    run's record beside where training stands."""
    return Manifest(
        tag=tag,
        iteration=iteration,
        files={},
        tokens=tokens,
        val_loss=val_loss,
        best_val_loss=best_val_loss,
        best_tag=best_tag,
        early_stop=early_stop,
        data_stream=STREAM,
        **{f.name: getattr(run, f.name) for f in dataclasses.fields(run)},
    )


NOT_REPLAYED = ("resume",)  # a replay repeats the run from its start, in its own out dir


def replayed_flags(data: dict[str, Any]) -> dict[str, Any]:
    """The flags `--config TAG/gpt_ds.json` replays: the run config as the user asked it, in
    this format's layout, less --resume."""
    config = data["config"] if _version(data) else _config_from_version_0(data["config"])
    return {k: v for k, v in config.items() if k not in NOT_REPLAYED}


_REQUIRED = {"tag", "iteration", "world_size", "zero_stage", "model", "config", "files"}


def migrate(data: dict[str, Any], tag_dir: Path | str = "") -> dict[str, Any]:
    """A manifest's fields in this format's layout, from the layout of any gpt_ds that wrote
    one (a CheckpointError for a newer format). Version 0 is every manifest before
    `format_version` existed; fields it may lack are filled as those versions meant them."""
    version = _version(data, tag_dir)
    if version == 0:
        data, version = _from_version_0(data), 1
    if version == 1:
        data = _from_version_1(data)
    return data


# version 1's plan record repeated these manifest fields
_REPEATED_IN_PLAN = ("micro_batch_size", "grad_accum", "precision", "zero_stage")


def _from_version_1(old: dict[str, Any]) -> dict[str, Any]:
    """Version 1 to 2: each fact once; the plan record no longer repeats the batch split,
    precision and stage the manifest holds."""
    plan = old.get("plan")
    if plan is not None:
        plan = {k: v for k, v in plan.items() if k not in _REPEATED_IN_PLAN}
    return dict(old, format_version=2, plan=plan)


def _version(data: dict[str, Any], tag_dir: Path | str = "") -> int:
    version = data.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{Path(tag_dir) / MANIFEST}: checkpoint format {version!r}, this gpt_ds reads up "
            f"to {FORMAT_VERSION}: load it with the gpt_ds that wrote it, or a newer one"
        )
    return version


def _from_version_0(old: dict[str, Any]) -> dict[str, Any]:
    """Version 0 to 1: the batch where only the flags held it, the tokens trained on from that
    batch, the per-rank data stream (before the global one), the run config as asked; a
    universal tag's files, which were its source's."""
    new = dict(old, format_version=1, config=_config_from_version_0(old["config"]))
    for name in ("micro_batch_size", "grad_accum"):
        if new.get(name) is None:
            new[name] = old["config"].get(name)
    if new.get("tokens") is None and new["micro_batch_size"] and new["grad_accum"]:
        batch = new["micro_batch_size"] * new["grad_accum"] * new["world_size"]
        new["tokens"] = new["iteration"] * batch * int(new["model"]["block_size"])
    new["data_stream"] = new.get("data_stream") or "per_rank"
    if new.get("universal"):  # it listed its source's files, not its own: none to verify
        new.update(files={}, checksums={}, checksum_algorithm=None)
    return new


def _config_from_version_0(old: dict[str, Any]) -> dict[str, Any]:
    """The run config as asked: version 0 wrote a budget's computed steps into max_iters, and
    --compile was true/false before `auto`."""
    config = dict(old)
    if config.get("max_tokens") is not None or config.get("max_epochs") is not None:
        config["max_iters"] = None  # planned from the budget, not asked
    if isinstance(config.get("compile"), bool):
        config["compile"] = "on" if config["compile"] else "off"
    return config


def needs_universal(manifest: Manifest, world_size: int) -> bool:
    """True when a checkpoint must be loaded as a universal one by a run of `world_size`."""
    return manifest.universal or manifest.world_size != world_size
