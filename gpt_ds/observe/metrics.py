"""Rank-0 training logs: readable console lines, `OUT_DIR/metrics.jsonl` (one JSON record per
line) and the DeepSpeed monitors (TensorBoard, W&B, CSV; `EngineMonitor`), all from one record.

Throughput, TFLOP/s, MFU (against the accelerator's peak: `resolve_peak`), ETA and peak memory
(a rank's RSS too, and giving freed host memory back: `release_freed_blocks`) are derived here
so the training loop only reports raw facts (iteration, loss, lr, gradient norm, elapsed
time). Every record has a `kind` ("train", "eval" or "event"), the wall-clock `time` and the
launch's `run_id`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import os
import re
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt_ds.base import logs
from gpt_ds.dsconfig.monitors import SECTIONS, enabled

# A rank's resident memory (RSS): its peak, and glibc's habit of keeping what a step freed.
#
# Measured on this project's CPU machines (BENCHMARKS.md): a ZeRO-3 step of gpt2-medium on 4
# ranks peaked at 5.0-5.5 GiB RSS per rank against 3.3 GiB of live tensors. The difference is
# glibc's heap: blocks a step frees (gathered parameters, reduction buckets) are kept for reuse,
# and the next allocations of other sizes grow the heap instead. A fixed mmap threshold makes
# every block from 1 MiB up its own mapping, handed back to the kernel when freed: the same run
# then peaks at 3.3 GiB at the same step time. On small models, whose steps allocate and free
# multi-MiB activations many times a second, the page faults cost 10-35% of the speed, so `auto`
# releases only for models of 100M parameters and more on CPU ranks, where the host memory is
# the training memory and the saving is gigabytes.

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
RELEASE_THRESHOLD = 1 << 20  # blocks from 1 MiB up: mapped, and unmapped when freed
AUTO_MIN_PARAMS = 100_000_000
RELEASE_CHOICES = ("auto", "on", "off")


def peak_rss_gib() -> float:
    """This process's peak resident set size so far, in GiB (Linux reports KiB, macOS bytes):
    the one peak-RSS reading of the package (training metrics, the export's summary)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 * (1 if sys.platform == "darwin" else 1024)


def wants_release(choice: str, device_type: str, num_params: int) -> bool:
    """Whether to release freed blocks: `on`/`off` as asked; `auto` on CPU for large models."""
    if choice != "auto":
        return choice == "on"
    return device_type == "cpu" and num_params >= AUTO_MIN_PARAMS


def release_freed_blocks() -> str:
    """Set glibc's mmap threshold (fixed: no more dynamic raising); a line for the log."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, RELEASE_THRESHOLD) == 1
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        ok = False
    if not ok:
        return "host memory: this C library has no mallopt; freed blocks stay with the process"
    return (
        "host memory: blocks of 1 MiB and more go back to the kernel when freed "
        "(--release_host_memory)"
    )


# Peak dense 16-bit matmul throughput of the run's accelerator, for MFU.
#
# Keyed by the exact model in the name the driver reports (`torch.cuda.get_device_name()`), so a
# PCIe card does not get its SXM sibling's figure and "L40" never matches "L40S". Figures are
# the vendors' dense matrix peaks (no structured sparsity) in the precision a run trains there:
# bf16 where the card has it natively (`precision.gpu_precision` picks bf16 there), fp16 on
# V100 / T4-class cards (which train fp16). In TFLOP/s per device torch sees: an MI250X/MI250
# package is two GCDs, each its own device and rank, so those rows are half the package figure.
# An unknown device gives None and the trainer says so once (`--peak_tflops` sets it).

# (model, pattern over the upper-cased device name, dense TFLOP/s); first match wins, so each
# variant comes before its family's plain name. Sources: NVIDIA and AMD datasheets; AMD's
# rows are its published "Peak FP16/BF16 (dense) matrix" TFLOPs (amd.com product spec pages),
# which are CUs x matrix FLOP/clock/CU x peak engine clock, as the comments recompute.
PEAK_TFLOPS: tuple[tuple[str, str, float], ...] = (
    ("GB200", r"\bGB200\b", 2500.0),
    ("B200", r"\bB200\b", 2250.0),
    ("B100", r"\bB100\b", 1750.0),
    ("GH200", r"\bGH200\b", 989.4),
    ("H200 NVL", r"\bH200\b.*\bNVL\b", 835.0),
    ("H200", r"\bH200\b", 989.4),
    ("H100 NVL", r"\bH100\b.*\bNVL\b", 835.0),
    ("H100 PCIe", r"\bH100\b.*\bPCIE\b", 756.0),
    ("H100 SXM", r"\bH100\b", 989.4),  # "H100 80GB HBM3", "H100 SXM5 80GB"
    ("H800 PCIe", r"\bH800\b.*\bPCIE\b", 756.0),
    ("H800", r"\bH800\b", 989.4),
    ("H20", r"\bH20\b", 148.0),
    ("A100", r"\bA100\b", 312.0),  # SXM4 and PCIe, 40 and 80 GB alike
    ("A800", r"\bA800\b", 312.0),
    ("A30", r"\bA30\b", 165.0),
    ("A10G", r"\bA10G\b", 125.0),
    ("A10", r"\bA10\b", 125.0),
    ("L40S", r"\bL40S\b", 362.1),
    ("L40", r"\bL40\b", 181.0),
    ("L20", r"\bL20\b", 119.5),
    ("L4", r"\bL4\b", 121.0),
    ("V100S", r"\bV100S\b", 130.0),
    ("V100 PCIe", r"\bV100\b.*\bPCIE\b", 112.0),
    ("V100", r"\bV100\b", 125.0),
    ("RTX 6000 Ada", r"\bRTX 6000 ADA\b", 364.2),
    ("RTX 4090", r"\bRTX 4090\b", 165.2),
    ("RTX 3090", r"\bRTX 3090\b", 71.0),
    ("MI355X", r"\bMI355X\b", 2500.0),
    ("MI350X", r"\bMI350X\b", 2300.0),
    ("MI325X", r"\bMI325X\b", 1307.4),
    ("MI300X", r"\bMI300X\b", 1307.4),
    ("MI300A", r"\bMI300A\b", 980.6),
    # MI250X / MI250: AMD lists 383.0 / 362.1 TFLOPs bf16 for the OAM package, 2 GCDs (220 /
    # 208 CUs x 1024 x 1.7 GHz); torch shows each GCD as a device, run by one rank. The name
    # ROCm reports for both is often "AMD Instinct MI250X/MI250": MI250X's figure then.
    ("MI250X (1 GCD)", r"\bMI250X\b", 191.5),
    ("MI250 (1 GCD)", r"\bMI250\b", 181.0),
    ("MI210", r"\bMI210\b", 181.0),  # one GCD, 104 CUs x 1024 x 1.7 GHz
    # MI100: 184.6 TFLOPs is its fp16 peak; bf16 (what ROCm runs train) is half: 92.3
    ("MI100", r"\bMI100\b", 92.3),
    # Radeon, RDNA4: AI PRO R9700, 64 CUs x 1024 x 2.92 GHz = 191 TFLOPs fp16/bf16 dense
    # (AMD: 191 dense, 383 with sparsity)
    ("Radeon AI PRO R9700", r"\bR9700\b", 191.0),
    # Radeon, RDNA3 (WMMA, bf16 at the fp16 rate, 512 FLOP/clock/CU): AMD's peak fp16 figures
    # 7900 XTX 96 CUs x 2.5 GHz = 122.8, XT 84 x 2.4 = 103 (as AMD rounds it), GRE 80 x 2.245
    # = 91.96
    ("RX 7900 XTX", r"\bRX 7900 XTX\b", 122.8),
    ("RX 7900 XT", r"\bRX 7900 XT\b", 103.0),
    ("RX 7900 GRE", r"\bRX 7900 GRE\b", 91.96),
)


def lookup(device_name: str) -> tuple[str, float] | None:
    """(model, dense TFLOP/s) for a device name such as "NVIDIA H100 PCIe", or None."""
    name = device_name.upper().replace("-", " ").replace("_", " ")
    for model, pattern, tflops in PEAK_TFLOPS:
        if re.search(pattern, name):
            return model, tflops
    return None


def device_name() -> str | None:
    """This rank's accelerator as the driver names it; None on CPU."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def resolve_peak(override_tflops: float | None) -> tuple[float | None, str]:
    """(peak FLOP/s per device or None, a line for the log saying where it came from)."""
    if override_tflops is not None:
        return override_tflops * 1e12, f"MFU against {override_tflops:g} TFLOP/s (--peak_tflops)"
    name = device_name()
    if name is None:
        return None, "MFU: not reported on CPU (no peak to compare with)"
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


ATTEMPT_PREFIX = f"{METRICS_FILE}.attempt-"  # + the run id of a launch that left no checkpoint


def attempt_file(out_dir: str | Path) -> Path | None:
    """Where `set_aside_attempt` would move metrics.jsonl (named by the run id of its last
    record; its time stamp where no record has one), or None when there is no such file."""
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return None
    ids = [r.get("run_id") for r in json_records(path)]
    name = next((i for i in reversed(ids) if isinstance(i, str) and i), None)
    name = name or time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    aside, n = path.with_name(ATTEMPT_PREFIX + name), 1
    while aside.exists():  # a run id is unique; a time stamp need not be
        n += 1
        aside = path.with_name(f"{ATTEMPT_PREFIX}{name}.{n}")
    return aside


def set_aside_attempt(out_dir: str | Path) -> Path | None:
    """Move metrics.jsonl, the records of a launch killed before its first checkpoint, to
    `attempt_file`'s name, so the run started afresh logs each iteration once and the killed
    attempt's records stay readable apart (`read_attempts`). Returns the new path."""
    aside = attempt_file(out_dir)
    if aside is not None:
        os.replace(Path(out_dir) / METRICS_FILE, aside)
    return aside


def read_attempts(out_dir: str | Path) -> dict[str, list[dict]]:
    """The records of each launch that was set aside (killed before its first checkpoint, the
    run then started afresh), keyed by run id, oldest first; torn lines skipped."""
    files = sorted(Path(out_dir).glob(ATTEMPT_PREFIX + "*"), key=lambda f: f.stat().st_mtime)
    return {f.name.removeprefix(ATTEMPT_PREFIX): json_records(f) for f in files}


def json_records(path: Path) -> list[dict]:
    """The JSON objects of a metrics file; other lines (a torn last line, foreign text)
    skipped, for readers that must not fail on a crashed launch's file."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


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
