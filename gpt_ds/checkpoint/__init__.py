"""Checkpoints of a training run: the manifest format, which tags exist, save/load, universal.

- manifest.py: `Manifest`, the only reader and writer of `TAG/gpt_ds.json`;
- tags.py: `complete_tags`, `resolve` (the tag a request means, checked), `latest`, and
  `check_writable` (the out dir, before the first save);
- integrity.py: per-file SHA-256 checksums, written at save and verified before loading;
- checkpointer.py: `Checkpointer`, the save protocol and exact resume;
- universal.py: conversion to DeepSpeed's universal format, for another world size.
"""

from gpt_ds.checkpoint.checkpointer import (
    Checkpointer,
    Resumed,
    check_model,
    check_same_data,
    damaged_files,
)
from gpt_ds.checkpoint.integrity import (
    ALLOW_HELP,
    UnverifiedCheckpoint,
    unverified_reason,
)
from gpt_ds.checkpoint.manifest import MANIFEST, Manifest
from gpt_ds.checkpoint.tags import (
    LATEST,
    CheckpointRef,
    check_writable,
    complete_tags,
    is_checkpoint_dir,
    latest_tag,
    partial_dirs,
    resolve,
)
from gpt_ds.checkpoint.universal import convert_on_rank0, convert_to_universal, needs_universal

__all__ = [
    "ALLOW_HELP",
    "UnverifiedCheckpoint",
    "unverified_reason",
    "LATEST",
    "MANIFEST",
    "CheckpointRef",
    "Checkpointer",
    "Manifest",
    "Resumed",
    "check_model",
    "check_same_data",
    "check_writable",
    "complete_tags",
    "convert_on_rank0",
    "convert_to_universal",
    "damaged_files",
    "is_checkpoint_dir",
    "latest_tag",
    "needs_universal",
    "partial_dirs",
    "resolve",
]
