"""Where a new run's first weights come from: `--init_from`.

- `scratch`: GPT-2's own initialisation (model.build_model);
- a Hugging Face GPT-2 directory or hub name: `from_pretrained`, partitioned under ZeRO-3;
- an earlier gpt_ds run, `OUT_DIR[:TAG]` (or a tag directory): its weights only. The new run
  starts at iteration 0 with a fresh optimizer and schedule in its own `--out_dir`; `--resume`
  is what continues the same run.

A checkpoint is turned into a Hugging Face directory once, by rank 0, through the exporter
(export.py: DeepSpeed's consolidation of any ZeRO stage and world size, checksums verified),
inside the new run's out dir; every rank then loads that directory the way it loads pretrained
weights (ZeRO-3 fills its shards layer by layer), and rank 0 removes it once all have.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from gpt_ds.base.errors import CheckpointError, ConfigError
from gpt_ds.checkpoint.tags import CheckpointRef, is_checkpoint_dir, resolve
from gpt_ds.model.gpt2 import (
    ModelShape,
    padded_vocab,
    pretrained_shape,
    unpadded,
)
from gpt_ds.run.config import RunConfig

SCRATCH = "scratch"
STAGING = ".init_weights"  # in the new run's out dir while the ranks load it


@dataclass(frozen=True)
class InitSource:
    """`--init_from` resolved: `checkpoint` is set for an earlier gpt_ds run's weights."""

    value: str
    checkpoint: CheckpointRef | None = None

    @property
    def is_scratch(self) -> bool:
        return self.value == SCRATCH

    def describe(self) -> str:
        ref = self.checkpoint
        if ref is None:
            return self.value
        return f"{ref.out_dir}:{ref.tag} (iteration {ref.manifest.iteration})"


def _split_tag(value: str) -> tuple[Path, str | None]:
    """`OUT_DIR:TAG` -> (OUT_DIR, TAG) when OUT_DIR is a run directory; else (value, None)."""
    path = Path(value)
    if ":" in value and not path.exists():
        head, tag = value.rsplit(":", 1)
        if tag and is_checkpoint_dir(Path(head)):
            return Path(head), tag
    return path, None


def resolve_init(
    value: str, out_dir: str | Path | None = None, allow_unverified: bool = False
) -> InitSource:
    """`--init_from` as an InitSource; a gpt_ds checkpoint is checked (complete, checksums
    recorded unless `allow_unverified`, not the new run's own out dir) but its checksums are
    the exporter's to verify, once, on rank 0."""
    if value == SCRATCH:
        return InitSource(value)
    path, tag = _split_tag(value)
    if not (path.is_dir() and is_checkpoint_dir(path)):
        return InitSource(value)  # Hugging Face weights (model.pretrained_shape checks them)
    ref = resolve(path, tag, flag="--init_from OUT_DIR:TAG", allow_unverified=allow_unverified)
    if ref.manifest.universal:
        raise CheckpointError(
            f"--init_from {value}: {ref.tag_dir} is a universal checkpoint; name the tag it "
            f"was made from, {ref.manifest.source_tag!r}"
        )
    if out_dir is not None and ref.out_dir.resolve() == Path(out_dir).resolve():
        raise ConfigError(
            f"--init_from {value} is this run's own --out_dir: to continue that run use "
            f"--resume; to start a new run from its weights give another --out_dir"
        )
    return InitSource(value, ref)


def checkpoint_shape(ref: CheckpointRef, block_size: int | None) -> ModelShape:
    """The shape a run initialised from `ref` trains: the saved model without vocabulary
    padding (the exported weights are GPT-2's own), at `block_size` up to the saved one."""
    saved = unpadded(ref.manifest.shape)
    if block_size and block_size > saved.block_size:
        raise ConfigError(
            f"--block_size {block_size} exceeds the {saved.block_size} positions of the model "
            f"in {ref.tag_dir}"
        )
    return replace(saved, block_size=block_size or saved.block_size)


def init_shape(init: InitSource, block_size: int | None) -> ModelShape:
    """The shape of `--init_from` weights (not scratch): a checkpoint's or Hugging Face's."""
    if init.checkpoint is not None:
        return checkpoint_shape(init.checkpoint, block_size)
    return pretrained_shape(init.value, block_size)


def model_source(cfg: RunConfig, preset: ModelShape | None) -> tuple[InitSource, ModelShape]:
    """The run's first weights (`--init_from`) and the shape it trains: that of the weights,
    or (scratch) `preset`, the model preset with the shape flags (run/config.py `validate`
    resolved it), its vocabulary padded (`--vocab_multiple`)."""
    init = resolve_init(cfg.init_from, cfg.out_dir, cfg.allow_unverified)
    if not init.is_scratch:
        return init, init_shape(init, cfg.block_size)
    assert preset is not None, "validate() resolves the preset of a run from scratch"
    return init, padded_vocab(preset, cfg.vocab_multiple)


def export_for_loading(ref: CheckpointRef, out_dir: str | Path, log=print) -> Path:
    """Rank 0's part: the checkpoint as a Hugging Face directory in the new run's out dir."""
    from gpt_ds.export.hf import export_checkpoint

    staging = Path(out_dir) / STAGING
    if staging.exists():  # left by a launch that died while loading
        shutil.rmtree(staging)
    # verified as it is read; one without checksums got here only with --allow_unverified
    export_checkpoint(
        ref.tag_dir,
        staging,
        fmt="hf",
        dtype="fp32",
        progress=False,
        log=log,
        allow_unverified=True,
    )
    return staging


def remove_staging(out_dir: str | Path) -> None:
    shutil.rmtree(Path(out_dir) / STAGING, ignore_errors=True)
