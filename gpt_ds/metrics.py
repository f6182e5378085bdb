"""Rank-0 training logs: readable console lines plus `OUT_DIR/metrics.jsonl`, one JSON per line.

Throughput, MFU and peak memory are derived here so the training loop only reports raw facts
(iteration, loss, lr, tokens processed, elapsed time).
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path

import torch

# Dense bf16/fp16 peak TFLOPS of common training GPUs, for MFU. Matched by substring.
GPU_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "A10G": 125.0,
    "L40S": 362.0,
    "L4": 121.0,
    "V100": 125.0,
    "MI300X": 1307.0,
    "MI250X": 383.0,
    "MI250": 362.0,
    "MI210": 181.0,
    "MI100": 184.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
}


def peak_flops_per_device() -> float | None:
    """Peak dense half-precision FLOP/s of this rank's GPU, or None (CPU, unknown GPU)."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    for key, tflops in GPU_PEAK_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def peak_memory_gib() -> float:
    """Peak device memory of this rank (GPU allocator), or peak RSS on CPU, in GiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return kib / 2**20


class MetricsLogger:
    """Writes log and eval records on rank 0; a no-op elsewhere."""

    def __init__(
        self,
        out_dir: str | Path,
        enabled: bool,
        flops_per_token: float,
        world_size: int,
        run_id: str = "",
    ):
        self.enabled = enabled
        self.run_id = run_id  # in every record: tells one launch's lines from another's
        self.path = Path(out_dir) / "metrics.jsonl"
        self.flops_per_token = flops_per_token
        self.world_size = world_size
        self.peak_flops = peak_flops_per_device()
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                # wall-clock seconds: when each record was written (benchmarks time steps by it)
                rec = {**record, "time": round(time.time(), 3), "run_id": self.run_id}
                f.write(json.dumps(rec) + "\n")

    def log_train(
        self,
        iteration: int,
        loss: float,
        lr: float,
        tokens: int,
        steps: int,
        seconds: float,
        comm_seconds_per_step: float | None = None,
    ) -> dict:
        """Log `steps` iterations that processed `tokens` tokens (all ranks) in `seconds`.

        `seconds` counts training steps only, so evaluation and checkpoint time do not
        depress the throughput figures.
        """
        dt = max(seconds, 1e-9)
        tps = tokens / dt
        rec = {
            "iter": iteration,
            "loss": loss,
            "lr": lr,
            "tokens_per_sec": round(tps, 1),
            "step_time_s": round(dt / steps, 4),
            "peak_mem_gib": round(peak_memory_gib(), 3),
        }
        if comm_seconds_per_step is not None:
            rec["comm_share"] = round(min(1.0, comm_seconds_per_step / rec["step_time_s"]), 3)
        if self.peak_flops:
            rec["mfu"] = round(tps * self.flops_per_token / (self.peak_flops * self.world_size), 4)
        if self.enabled:
            mfu = f" | mfu {rec['mfu'] * 100:5.1f}%" if "mfu" in rec else ""
            if "comm_share" in rec:
                mfu += f" | comm ~{rec['comm_share'] * 100:.0f}%"
            print(
                f"iter {iteration:6d} | loss {loss:.4f} | lr {lr:.3e} | {tps:9.0f} tok/s | "
                f"{rec['step_time_s'] * 1000:7.1f} ms/it | mem {rec['peak_mem_gib']:.2f} GiB{mfu}",
                flush=True,
            )
            self.write(rec)
        return rec

    def log_eval(
        self, iteration: int, val_loss: float, train_loss: float | None, ppl: float
    ) -> None:
        rec = {"iter": iteration, "val_loss": val_loss, "val_ppl": round(ppl, 3)}
        if train_loss is not None and math.isfinite(train_loss):
            rec["train_loss"] = train_loss
        if self.enabled:
            print(f"eval {iteration:6d} | val loss {val_loss:.4f} | val ppl {ppl:.2f}", flush=True)
            self.write(rec)

    def event(self, record: dict) -> None:
        """Any other record (start, checkpoint, stop) for the jsonl timeline."""
        self.write(record)
        if self.enabled and record.get("message"):
            print(record["message"], file=sys.stdout, flush=True)


def read_metrics(out_dir: str | Path, tolerate_partial_last_line: bool = False) -> list[dict]:
    """Every record of `OUT_DIR/metrics.jsonl`, in file order.

    For a run still writing (`tolerate_partial_last_line=True`): a file not created yet reads as
    no records, and a last line not yet ended by its newline is left out (the next read gets it).
    Any other line that is not JSON raises ValueError naming the file and line.
    """
    path = Path(out_dir) / "metrics.jsonl"
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
