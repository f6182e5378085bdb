"""The largest GPT-2 this machine can train: each preset on 2 ranks under ZeRO-3, a few steps,
its measured peak RSS per rank and seconds per step beside the memory model's prediction and
the memory guard's verdict.

    python benchmarks/scale.py          # gpt2 .. gpt2-xl (xl launched only if predicted to fit)
    python benchmarks/scale.py --models gpt2-tiny --steps 2 --release_off

Each row is a real `deepspeed --num_gpus RANKS gpt_ds/train.py` launch (fp32, block 128,
micro-batch 1, no eval, no checkpoint) with `--ignore_memory_estimate`, so that a run the
guard refuses is measured all the same; the guard's own verdict (fits / refuses) is a column.
The prediction is the trainer's own estimate (gpt_ds.run.plan.plan_run on the same flags, in the
launch's world): its step total plus the rank's measured baseline (its peak RSS before
the model was built, from the trainer's start-up line). A model whose prediction times the
ranks exceeds the RAM is not launched. `--release_off MODEL` adds a row with
`--release_host_memory off` (glibc keeps freed blocks) to show what returning them saves.
Measured peak: every rank's VmHWM (the kernel's peak RSS), polled; the largest rank's.
A launch that fails or is OOM-killed gives a row saying so (rc, last lines), not a crash.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

from support.launch import TRAIN, planned  # noqa: E402
from support.peak_rss import run_watched  # noqa: E402
from support.workspace import prepare_shakespeare, work_dir  # noqa: E402

from gpt_ds.base.errors import ConfigError  # noqa: E402
from gpt_ds.launch.machine import device_memory_bytes, node_ram, node_ram_bytes  # noqa: E402
from gpt_ds.memory.estimate import GiB, MemoryEstimate  # noqa: E402
from gpt_ds.memory.guard import check_fits  # noqa: E402
from gpt_ds.model.gpt2 import MODEL_PRESETS  # noqa: E402
from gpt_ds.observe.metrics_file import read_metrics  # noqa: E402

# "rank 0 3.10 (2.61) GiB": the peak after start-up and the part that came with the model
STARTUP = re.compile(r"rank (\d+) ([\d.]+) \(([-\d.]+)\) GiB")


@dataclass
class Prediction:
    estimate: MemoryEstimate
    guard: str  # "fits" or "refuses"


@dataclass
class Launch:
    rc: int
    peak_gib: float  # the largest rank's VmHWM
    log: str
    out: Path


def run_argv(model: str, args: argparse.Namespace, out: Path, release: str) -> list[str]:
    """gpt_ds/train.py's flags for one row (the launch and the prediction share them)."""
    flags = {
        "--deepspeed_config": "zero3",
        "--model": model,
        "--block_size": args.block_size,
        "--micro_batch_size": 1,
        "--grad_accum": 1,
        "--max_iters": args.steps,
        "--warmup_iters": 1,
        "--eval_interval": 0,
        "--eval_iters": 1,
        "--log_interval": 1,
        "--precision": "fp32",
        "--release_host_memory": release,
        "--data_dir": args.data_dir,
        "--out_dir": out,
    }
    argv = [str(x) for kv in flags.items() for x in kv]
    return [*argv, "--no_checkpoint", "--ignore_memory_estimate"]


def predict(argv: list[str], ranks: int) -> Prediction:
    """The estimate the trainer prints for these flags (its own planning chain, in the world the
    launch gives it), and whether its guard would start the run. The plan's out dir is a scratch
    directory: plan_run creates it, and a row that is not launched leaves no directory."""
    est = planned(argv, ranks).estimate
    try:
        # the host: this machine's RAM, or its cgroup limit where lower (as the trainer checks)
        check_fits(est, ranks_per_node=ranks, device_bytes=device_memory_bytes(0), ram=node_ram())
    except ConfigError:
        return Prediction(est, "refuses")
    return Prediction(est, "fits")


def launch(argv: list[str], ranks: int, out: Path, timeout: float) -> Launch:
    """One launch, every rank's VmHWM polled; a failure (OOM kill included) is returned."""
    out.mkdir(parents=True)
    run = run_watched(ranks, [TRAIN, *argv], out / "log.txt", timeout)
    return Launch(run.rc, run.peak_bytes / GiB, (out / "log.txt").read_text(), out)


def startup(log: str) -> tuple[float, float] | None:
    """(largest start-up peak, largest baseline: peak before the model) in GiB, from the
    trainer's "memory after start-up" line."""
    line = next((x for x in log.splitlines() if "memory after start-up" in x), None)
    if line is None:
        return None
    ranks = [(float(p), float(p) - float(m)) for _, p, m in STARTUP.findall(line)]
    return max(p for p, _ in ranks), max(b for _, b in ranks)


def step_seconds(out: Path) -> float | None:
    """Median seconds per step after the first (metrics.jsonl's train records)."""
    times = [r["step_time_s"] for r in read_metrics(out) if "step_time_s" in r]
    return statistics.median(times[1:]) if len(times) > 1 else None


def row(name: str, params: float, pred: Prediction, run: Launch) -> str:
    """One markdown row of a launch, or of its failure (then the measured peak is a floor)."""
    est = pred.estimate.total / GiB
    start = startup(run.log)
    predicted = f"{est:.2f} + ? GiB"
    ratio, peak_start, measured = "-", "-", f"{run.peak_gib:.2f} GiB"
    if start is not None:
        total = est + start[1]
        predicted = f"{total:.2f} GiB ({est:.2f} + {start[1]:.2f})"
        ratio, peak_start = f"{run.peak_gib / total:.2f}", f"{start[0]:.2f} GiB"
    if run.rc == 0 and start is not None:
        sec = step_seconds(run.out)
        outcome, secs = "ran", f"{sec:.2f}" if sec is not None else "-"
    else:
        measured, ratio, secs = f">= {measured}", f">= {ratio}", "-"
        outcome = failure(run)
    return (
        f"| {name} | {params:,.0f}M | {predicted} | {measured} | {ratio} | {peak_start} | "
        f"{secs} | {pred.guard} | {outcome} |"
    )


def failure(run: Launch) -> str:
    """What a failed launch says: a SIGKILLed rank (the OOM killer), else its last lines."""
    done = sum(1 for r in read_metrics(run.out, True) if "step_time_s" in r)
    if re.search(r"exits with return code = -9\b", run.log):
        return f"failed: rc {run.rc}, a rank SIGKILLed (out of memory) after {done} step(s)"
    tail = " / ".join(x.strip() for x in run.log.strip().splitlines()[-3:]).replace("|", "/")
    return f"failed: rc {run.rc} after {done} step(s): {tail[-300:]}"


HEADER = [
    "| model | parameters | predicted peak per rank (step estimate + measured baseline) | "
    "measured peak RSS per rank (max over ranks) | measured / predicted | start-up peak per "
    "rank | seconds per step (median after the first) | guard | outcome |",
    "|---|---:|---:|---:|---:|---:|---:|---|---|",
]


def measure(args: argparse.Namespace, work: Path) -> list[str]:
    """Every model (and every --release_off row), smallest first; the table's rows."""
    rows, baseline, ram = [], 0.0, node_ram_bytes() / GiB
    todo = [(m, "auto") for m in args.models] + [(m, "off") for m in args.release_off]
    for model, release in todo:
        name = model if release == "auto" else f"{model}, --release_host_memory off"
        out = work / f"{model}_release_{release}"
        argv = run_argv(model, args, out, release)
        pred = predict(argv, args.ranks)
        params = pred.estimate.num_params / 1e6
        need = pred.estimate.total / GiB + baseline
        if need * args.ranks > ram:
            rows.append(
                f"| {name} | {params:,.0f}M | {need:.2f} GiB | - | - | - | - | {pred.guard} | "
                f"not run: predicted {need:.2f} GiB per rank x {args.ranks} > RAM "
                f"{ram:.1f} GiB |"
            )
            print(f"  {rows[-1]}", flush=True)
            continue
        run = launch(argv, args.ranks, out, args.timeout)
        rows.append(row(name, params, pred, run))
        print(f"  {rows[-1]}", flush=True)
        if (start := startup(run.log)) is not None:
            baseline = max(baseline, start[1])
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models",
        nargs="+",
        default=["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"],
        choices=list(MODEL_PRESETS),
        help="run in this order; the measured baseline of earlier rows feeds the prediction "
        "that decides whether a later one is launched",
    )
    p.add_argument(
        "--release_off",
        nargs="*",
        default=["gpt2-medium"],
        choices=list(MODEL_PRESETS),
        help="models also run with --release_host_memory off (none: no such row)",
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--block_size", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per launch (>= 2)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per launch")
    p.add_argument("--data_dir", help="a prepared data dir (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", help="keep every launch's log and output here")
    a = p.parse_args(argv)
    if a.steps < 2:
        p.error("--steps must be at least 2 (the first step is not timed)")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with work_dir(args.work_dir, "gpt_ds_scale_") as work:
        args.data_dir = args.data_dir or prepare_shakespeare(work)
        rows = measure(args, work)
    print(
        f"\n{args.ranks} ranks, ZeRO-3, fp32, block {args.block_size}, micro-batch 1, "
        f"{args.steps} steps; RAM {node_ram_bytes() / GiB:.1f} GiB\n"
    )
    print("\n".join(HEADER + rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
