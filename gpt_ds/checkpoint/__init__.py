"""Checkpoints of a training run: the manifest format, which tags exist, save/load, universal.

- manifest.py: `Manifest`, the only reader and writer of `TAG/gpt_ds.json`;
- tags.py: `complete_tags`, `resolve` (the tag a request means, checked), `latest`, and
  `check_writable` (the out dir, before the first save);
- integrity.py: per-file SHA-256 checksums, written at save and verified before loading;
- checkpointer.py: `Checkpointer`, the save protocol and exact resume;
- universal.py: conversion to DeepSpeed's universal format, for another world size.

Import each name from its module: the package imports nothing, so a run loads only what it uses.
"""
