"""Rank-0 training logs: readable console lines, `OUT_DIR/metrics.jsonl` (a JSON record a line,
appended here; read back by metrics_file.py) and the DeepSpeed monitors (TensorBoard, W&B, CSV;
`EngineMonitor`), all from one record.

Throughput, TFLOP/s, MFU (against the accelerator's peak: `resolve_peak`, from the table in
peak_flops.py), ETA and peak memory (a rank's RSS on CPU) are derived here so the training loop
only reports raw facts (iteration, loss, lr, gradient norm, elapsed time).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base import logs
from gpt_ds.base.processes import peak_rss_gib
from gpt_ds.dsconfig.monitors import SECTIONS, enabled
from gpt_ds.observe.metrics_file import METRICS_FILE


def resolve_peak(
    override_tflops: float | None, device_name: str | None
) -> tuple[float | None, str]:
    """(peak FLOP/s per device or None, a line for the log saying where it came from), for the
    GPU the driver names `device_name` (None: CPU ranks)."""
    if override_tflops is not None:
        return override_tflops * 1e12, f"MFU against {override_tflops:g} TFLOP/s (--peak_tflops)"
    if device_name is None:
        return None, "MFU: not reported on CPU (no peak to compare with)"
    from gpt_ds.observe.peak_flops import lookup

    name = device_name
    found = lookup(name)
    if found is None:
        return None, (
            f"MFU: unknown device {name!r}, not reported; give its dense bf16 peak with "
            "--peak_tflops N (TFLOP/s per GPU)"
        )
    model, tflops = found
    return tflops * 1e12, f"MFU against {tflops:g} TFLOP/s dense 16-bit ({model}, from {name!r})"


# DeepSpeed's monitors (TensorBoard, Weights & Biases, CSV) writing the run's own metrics.
#
# The DeepSpeed config's monitor sections are dsconfig/monitors.py's. The trainer writes through
# `engine.monitor` (metrics.py picks the tags), with the optimizer step as x axis. DeepSpeed's own
# events (`Train/Samples/lr` against samples) are turned off: W&B wants one increasing step per
# run, and the trainer logs the lr itself.


class EngineMonitor:
    """Writes scalars through `engine.monitor` (rank 0 only, as DeepSpeed does)."""

    def __init__(self, engine: Any):
        self.master = engine.monitor
        # DeepSpeed logs lr (and fp16's loss scale) against samples when `enabled`; the
        # trainer logs both against the optimizer step instead
        self.master.enabled = False

    @staticmethod
    def wanted(ds_config: dict) -> bool:
        return any(enabled(ds_config, section) for section in SECTIONS)

    def __call__(self, step: int, values: dict[str, float]) -> None:
        self.master.write_events([(tag, value, step) for tag, value in values.items()])

    def close(self) -> None:
        """Flush and close the writers: the ranks leave with os._exit, which skips W&B's
        and TensorBoard's exit hooks."""
        tb = getattr(self.master, "tb_monitor", None)
        if tb is not None and tb.summary_writer is not None:
            tb.summary_writer.close()
        if getattr(self.master, "wandb_monitor", None) is not None:
            import wandb

            wandb.finish()


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
    peak_flops: float | None  # per device, for MFU (`resolve_peak`)
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
            rec = {"kind": kind, **record, "time": round(time.time(), 3), "run_id": self.run_id}
            with self.path.open("a") as f:
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
        scores: dict[str, float] | None = None,
    ) -> None:
        """An evaluation; for a mixture `val_loss` is the weighted mean of `by_source`'s,
        each also recorded as `val_loss/<source>` (and monitored as `val/loss/<source>`).
        `scores`: benchmark figures of the same weights (`hellaswag_acc_norm`, ...), recorded
        and monitored as `val/<name>`."""
        rec = {
            "iter": iteration,
            "tokens": tokens,
            "val_loss": val_loss,
            "val_ppl": round(ppl, 3),
        }
        by_source = by_source or {}
        sources = {f"val_loss/{name}": loss for name, loss in by_source.items()}
        rec.update(sources)
        rec.update(scores or {})
        if train_loss is not None and math.isfinite(train_loss):
            rec["train_loss"] = train_loss
        if self.enabled:
            each = "".join(f" | {name} {loss:.4f}" for name, loss in by_source.items())
            each += _scores_text(scores or {})
            logs.LOGGER.info(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} eval {iteration:>{self._width}}/"
                f"{self.facts.max_iters} | val loss {val_loss:.4f} | val ppl {ppl:.2f}{each}"
            )
            self.write("eval", rec)
            tags = {**_EVAL_TAGS, **{key: key.replace("val_loss/", "val/loss/") for key in sources}}
            tags.update({key: f"val/{key}" for key in scores or {} if key in _SCORE_TAGS})
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
_SCORE_TAGS = ("hellaswag_acc_norm", "hellaswag_acc")  # monitored; the example count only logged


def _scores_text(scores: dict[str, float]) -> str:
    """The eval line's tail for benchmark scores, e.g.
    ` | hellaswag acc_norm 0.2950 acc 0.2890 (10042)`: the examples scored in brackets."""
    if "hellaswag_acc_norm" not in scores:
        return ""
    return (
        f" | hellaswag acc_norm {scores['hellaswag_acc_norm']:.4f} "
        f"acc {scores['hellaswag_acc']:.4f} ({int(scores['hellaswag_examples'])})"
    )
