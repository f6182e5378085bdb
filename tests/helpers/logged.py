"""Logged values by iteration, from what a training run left in its out_dir (`metrics.jsonl`,
read through `gpt_ds.observe.metrics_file.read_metrics`); a re-run iteration (after a resume)
keeps its latest value."""

from __future__ import annotations

from pathlib import Path

from gpt_ds.observe.metrics_file import read_metrics


def train_losses(out: Path, tolerate_partial_last_line: bool = False) -> dict[int, float]:
    """iteration -> logged training loss (pass True while the run is still writing)."""
    records = read_metrics(out, tolerate_partial_last_line)
    return {r["iter"]: r["loss"] for r in records if "loss" in r}


def train_lrs(out: Path) -> dict[int, float]:
    """iteration -> logged learning rate."""
    return {r["iter"]: r["lr"] for r in read_metrics(out) if "lr" in r}


def val_losses(out: Path) -> dict[int, float]:
    """iteration -> logged validation loss."""
    return {r["iter"]: r["val_loss"] for r in read_metrics(out) if "val_loss" in r}
