"""Rank-0 training logs: readable console lines, `OUT_DIR/metrics.jsonl` (one JSON record per
line) and the DeepSpeed monitors (TensorBoard, W&B, CSV; monitoring.py), all from one record.

Throughput, TFLOP/s, MFU, ETA and peak memory are derived here so the training loop only
reports raw facts (iteration, loss, lr, gradient norm, elapsed time). Every record has a
`kind` ("train", "eval" or "event"), the wall-clock `time` and the launch's `run_id`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base import logs
from gpt_ds.observe.rss import peak_rss_gib

METRICS_FILE = "metrics.jsonl"
MonitorWriter = Callable[[int, dict[str, float]], None]  # (optimizer step, {tag: value})


def peak_memory_gib() -> float:
    """Peak device memory of this rank (GPU allocator), or peak RSS on CPU, in GiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return peak_rss_gib()


def format_duration(seconds: float) -> str:
    """45s, 2m40s, 3h05m, 2d04h: an ETA a person reads at a glance."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_count(n: int) -> str:
    """950, 12.3K, 4.56M, 1.20B: a token count at a glance."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)


@dataclass(frozen=True)
class RunFacts:
    """What the logger needs to know of the run to derive its figures."""

    max_iters: int
    tokens_per_iter: int  # all ranks: train_batch_size x block_size
    flops_per_token: float  # training FLOPs (forward + backward)
    world_size: int
    peak_flops: float | None  # per device, for MFU (peak_flops.py)
    start_iter: int = 0  # where this launch started (resume), for the ETA
    train_tokens: int | None = None  # the train split's size: epochs = tokens / train_tokens


class MetricsLogger:
    """Writes train, eval and event records on rank 0; a no-op elsewhere."""

    def __init__(
        self,
        out_dir: str | Path,
        enabled: bool,
        facts: RunFacts,
        run_id: str = "",
        monitor: MonitorWriter | None = None,
    ):
        self.enabled = enabled
        self.run_id = run_id  # in every record: tells one launch's lines from another's
        self.path = Path(out_dir) / METRICS_FILE
        self.facts = facts
        self.monitor = monitor
        self.started = time.perf_counter()
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                rec = {"kind": kind, **record, "time": round(time.time(), 3), "run_id": self.run_id}
                f.write(json.dumps(rec) + "\n")

    def log_train(
        self,
        iteration: int,
        tokens: int,
        loss: float,
        lr: float,
        steps: int,
        seconds: float,
        grad_norm: float | None = None,
        loss_scale: float | None = None,
        comm_seconds_per_step: float | None = None,
        batch: str | None = None,
    ) -> dict:
        """Log `steps` iterations that took `seconds` of training (evaluation and checkpoint
        time excluded, so they do not depress the throughput figures); `tokens`: trained on
        so far, all ranks; `batch`: a short hash of the logged step's global batch."""
        f = self.facts
        dt = max(seconds, 1e-9)
        tps = f.tokens_per_iter * steps / dt
        rec: dict[str, Any] = {
            "iter": iteration,
            "tokens": tokens,
            "loss": loss,
            "lr": lr,
            "tokens_per_sec": round(tps, 1),
            "step_time_s": round(dt / steps, 4),
            "peak_mem_gib": round(peak_memory_gib(), 3),
            "tflops": round(tps * f.flops_per_token / f.world_size / 1e12, 4),
        }
        if f.train_tokens:
            rec["epoch"] = round(tokens / f.train_tokens, 4)
        if grad_norm is not None and math.isfinite(grad_norm):
            rec["grad_norm"] = round(grad_norm, 5)
        if loss_scale is not None:
            rec["loss_scale"] = loss_scale
        if comm_seconds_per_step is not None:
            rec["comm_share"] = round(min(1.0, comm_seconds_per_step / rec["step_time_s"]), 3)
        if f.peak_flops:
            rec["mfu"] = round(rec["tflops"] * 1e12 / f.peak_flops, 4)
        if batch is not None:
            rec["batch"] = batch
        done = iteration - f.start_iter
        if done > 0:  # wall time per iteration so far, evaluations and checkpoints included
            rec["eta_s"] = round(
                (time.perf_counter() - self.started) / done * (f.max_iters - iteration), 1
            )
        if self.enabled:
            logs.LOGGER.info(self._train_line(rec))
            self.write("train", rec)
            self._monitor(iteration, _TRAIN_TAGS, rec)
        return rec

    def _train_line(self, rec: dict) -> str:
        parts = [
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} iter {rec['iter']:>{self._width}}/"
            f"{self.facts.max_iters}",
            f"loss {rec['loss']:.4f}",
            f"lr {rec['lr']:.3e}",
        ]
        if "epoch" in rec:
            parts.append(f"{format_count(rec['tokens'])} tok, epoch {rec['epoch']:.2f}")
        if "grad_norm" in rec:
            parts.append(f"gnorm {rec['grad_norm']:.3f}")
        parts += [
            f"{rec['tokens_per_sec']:,.0f} tok/s",
            f"{rec['step_time_s'] * 1000:.1f} ms/it",
            f"mem {rec['peak_mem_gib']:.2f} GiB",
            f"{rec['tflops']:.3g} TFLOP/s",
        ]
        if "mfu" in rec:
            parts.append(f"mfu {rec['mfu'] * 100:.1f}%")
        if "comm_share" in rec:
            parts.append(f"comm ~{rec['comm_share'] * 100:.0f}%")
        if "loss_scale" in rec:
            parts.append(f"scale {rec['loss_scale']:g}")
        if "eta_s" in rec:
            parts.append(f"ETA {format_duration(rec['eta_s'])}")
        return " | ".join(parts)

    @property
    def _width(self) -> int:
        return len(str(self.facts.max_iters))

    def log_eval(
        self,
        iteration: int,
        tokens: int,
        val_loss: float,
        train_loss: float | None,
        ppl: float,
        by_source: dict[str, float] | None = None,
    ) -> None:
        """An evaluation; for a mixture `val_loss` is the weighted mean of `by_source`'s,
        each also recorded as `val_loss/<source>` (and monitored as `val/loss/<source>`)."""
        rec = {
            "iter": iteration,
            "tokens": tokens,
            "val_loss": val_loss,
            "val_ppl": round(ppl, 3),
        }
        by_source = by_source or {}
        sources = {f"val_loss/{name}": loss for name, loss in by_source.items()}
        rec.update(sources)
        if train_loss is not None and math.isfinite(train_loss):
            rec["train_loss"] = train_loss
        if self.enabled:
            each = "".join(f" | {name} {loss:.4f}" for name, loss in by_source.items())
            logs.LOGGER.info(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} eval {iteration:>{self._width}}/"
                f"{self.facts.max_iters} | val loss {val_loss:.4f} | val ppl {ppl:.2f}{each}"
            )
            self.write("eval", rec)
            tags = {**_EVAL_TAGS, **{key: key.replace("val_loss/", "val/loss/") for key in sources}}
            self._monitor(iteration, tags, rec)

    def event(self, record: dict) -> None:
        """Any other record (start, checkpoint, stop) for the jsonl timeline."""
        self.write("event", record)
        if self.enabled and record.get("message"):
            logs.LOGGER.info(record["message"])

    def _monitor(self, step: int, tags: dict[str, str], rec: dict) -> None:
        if self.monitor is not None:
            self.monitor(step, {tag: rec[key] for key, tag in tags.items() if key in rec})


# record key -> monitor tag (TensorBoard / W&B / CSV), with the optimizer step as x axis
_TRAIN_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_sec": "train/tokens_per_sec",
    "tflops": "train/tflops_per_gpu",
    "mfu": "train/mfu",
    "peak_mem_gib": "train/memory_gib",
    "loss_scale": "train/loss_scale",
    "epoch": "train/epoch",
}
_EVAL_TAGS = {"val_loss": "val/loss", "val_ppl": "val/perplexity"}


def rewind(out_dir: str | Path, iteration: int) -> int:
    """Move the records past `iteration` (written by a launch that then crashed) from
    metrics.jsonl to metrics.jsonl.rewound-<iteration>, so a resumed run logs each iteration
    once. Returns how many records moved; the file is replaced atomically."""
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    keep: list[str] = []
    drop: list[str] = []
    for line in lines:
        try:
            past = json.loads(line).get("iter", -1) > iteration
        except (json.JSONDecodeError, AttributeError, TypeError):
            past = not line.endswith("\n")  # a torn last line of the crash: aside with the rest
        (drop if past else keep).append(line)
    if not drop:
        return 0
    aside = path.with_name(f"{METRICS_FILE}.rewound-{iteration}")
    with aside.open("a") as f:
        f.writelines(line if line.endswith("\n") else line + "\n" for line in drop)
    tmp = path.with_name(f".{METRICS_FILE}.tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)
    return len(drop)


KINDS = ("train", "eval", "event")


def record_kind(record: dict) -> str | None:
    """ "train", "eval" or "event": the record's `kind`, else inferred (records written before
    `kind` existed); None for anything else."""
    if record.get("kind") in KINDS:
        return record["kind"]
    if "val_loss" in record:
        return "eval"
    if "loss" in record:
        return "train"
    return "event" if "event" in record else None


def read_metrics(out_dir: str | Path, tolerate_partial_last_line: bool = False) -> list[dict]:
    """Every record of `OUT_DIR/metrics.jsonl`, in file order.

    For a run still writing (`tolerate_partial_last_line=True`): a file not created yet reads as
    no records, and a last line not yet ended by its newline is left out (the next read gets it).
    Any other line that is not JSON raises ValueError naming the file and line.
    """
    path = Path(out_dir) / METRICS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        if tolerate_partial_last_line:
            return []
        raise
    lines = text.splitlines()
    if tolerate_partial_last_line and lines and not text.endswith("\n"):
        lines.pop()
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON record ({e.msg}): {line[:80]!r}") from None
    return records
