"""Universal checkpoints: DeepSpeed's `ds_to_universal`, to resume on another world size.

Training converts by itself when `--resume` finds a checkpoint saved by another number of
ranks (`needs_universal`, then `convert_on_rank0`); tools/universal_checkpoint.py does the same
by hand. The result `<tag>_universal` is published like any checkpoint: a staging directory,
then a manifest marked `universal` that names its source tag and lists its own files (DeepSpeed's
per-parameter layout) with their sizes and checksums, verified like any other tag's on load.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys

from gpt_ds.base import dist
from gpt_ds.base.errors import CheckpointError
from gpt_ds.checkpoint.checkpointer import publish, rank_state_name
from gpt_ds.checkpoint.integrity import ALGORITHM, digests_of
from gpt_ds.checkpoint.manifest import Manifest
from gpt_ds.checkpoint.tags import PARTIAL, CheckpointRef, damage


def universal_tag(tag: str) -> str:
    return f"{tag}_universal"


def universal_refusal(manifest: Manifest) -> str | None:
    """Why DeepSpeed cannot make a universal checkpoint of `manifest`'s save, or None.

    Muon: DeepSpeed 0.19's converter reads every parameter's state as Adam's two moments
    (ds_to_universal's extraction of `exp_avg`), and Muon's matrices keep one momentum
    buffer instead, so it fails with a KeyError; its universal load has no Muon path either.
    """
    if manifest.optimizer == "muon":
        return (
            "DeepSpeed's universal checkpoint cannot hold Muon's state (ds_to_universal reads "
            "Adam's exp_avg for every parameter; Muon's matrices keep one momentum buffer)"
        )
    return None


def _ds_to_universal(ref: CheckpointRef, staging) -> None:
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(ref.tag_dir),
        "--output_folder",
        str(staging),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    if ref.manifest.zero_stage < 3:  # ZeRO-1/2 files lack the info block; injected in memory
        cmd.append("--inject_missing_state")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(
            f"ds_to_universal failed on {ref.tag_dir} (exit {proc.returncode}):\n"
            f"{proc.stderr[-3000:]}"
        )


def convert_to_universal(ref: CheckpointRef) -> CheckpointRef:
    """The universal form of `ref` (itself if it is one), converted unless an intact one made
    from `ref` as it is now exists. Carries rank 0's training-window position. Runs in one
    process."""
    if ref.manifest.universal:
        return ref
    reason = universal_refusal(ref.manifest)
    if reason is not None:
        raise CheckpointError(f"{ref.tag_dir}: no universal checkpoint can be made: {reason}")
    dst_tag = universal_tag(ref.tag)
    dst = ref.out_dir / dst_tag
    existing = Manifest.read(dst)
    # none yet, one made from an older checkpoint of the same name (`final` is rewritten by
    # every run that ends), or one damaged since: convert again
    if existing is None or not existing.converted_from(ref.manifest) or damage(dst, existing):
        existing = _convert(ref, dst_tag)
    return CheckpointRef(out_dir=ref.out_dir, tag=dst_tag, manifest=existing)


def _convert(ref: CheckpointRef, dst_tag: str) -> Manifest:
    """ds_to_universal into a staging directory, its own files listed and hashed, published."""
    staging = ref.out_dir / (dst_tag + PARTIAL)
    shutil.rmtree(staging, ignore_errors=True)
    _ds_to_universal(ref, staging)
    shutil.copy2(ref.tag_dir / rank_state_name(0), staging / rank_state_name(0))
    files = {
        p.relative_to(staging).as_posix(): p.stat().st_size
        for p in sorted(staging.rglob("*"))
        if p.is_file()
    }
    manifest = dataclasses.replace(
        ref.manifest,
        tag=dst_tag,
        universal=True,
        source_tag=ref.tag,
        source_digest=ref.manifest.digest(),
        files=files,
        checksums=digests_of(staging, list(files)),
        checksum_algorithm=ALGORITHM,
    )
    manifest.write(staging)
    publish(staging, ref.out_dir / dst_tag)
    (ref.out_dir / "latest_universal").unlink(missing_ok=True)  # ds_to_universal's own
    return manifest


def convert_on_rank0(ref: CheckpointRef) -> CheckpointRef:
    """`convert_to_universal` run by rank 0 while the others wait; a failure on rank 0 is
    raised on every rank."""
    error = None
    if dist.is_main() and not ref.manifest.universal:
        dist.print0(
            f"checkpoint {ref.tag} was saved by {ref.manifest.world_size} ranks, this run has "
            f"{dist.world_size()}: converting it to a universal checkpoint"
        )
        try:
            convert_to_universal(ref)
        except CheckpointError as exc:
            error = exc
    if dist.any_rank(error is not None):
        raise error or CheckpointError("universal checkpoint conversion failed on rank 0")
    if ref.manifest.universal:
        return ref
    tag = universal_tag(ref.tag)
    manifest = Manifest.read(ref.out_dir / tag)
    assert manifest is not None, f"{tag}: rank 0 published it, manifest included"
    return CheckpointRef(out_dir=ref.out_dir, tag=tag, manifest=manifest)
