"""Activation checkpointing's saving and price: peak memory per rank and tokens/s of gpt_ds with
and without `--activation_checkpointing`, per ZeRO stage, at a size where activations matter.

    python benchmarks/activation_checkpointing.py      # gpt2-mini, block 256, micro-batch 16
    python benchmarks/activation_checkpointing.py --stages 2 --steps 4 --warmup 1 --reps 1

Each row is a real `deepspeed --num_gpus RANKS gpt_ds/train.py` launch through
support/timed_runs.py, as in benchmarks/throughput.py (the same launch, the same timing from
metrics.jsonl, the same peak memory: the largest rank's peak RSS on CPU, the allocator's peak
on GPUs), repetitions interleaved, medians reported. Beside the measured saving stands what
gpt_ds's memory model predicts the layers keep for backward with and without recomputation
(gpt_ds.memory).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

import torch  # noqa: E402
from support.timed_runs import (  # noqa: E402
    Measured,
    Setup,
    add_launch_options,
    measure,
    parse_launch_args,
)
from support.workspace import prepare_shakespeare, work_dir  # noqa: E402

from gpt_ds.memory.estimate import activation_bytes  # noqa: E402
from gpt_ds.model.gpt2 import MODEL_PRESETS, ModelShape  # noqa: E402

OFF, ON = "gpt_ds", "gpt_ds --activation_checkpointing"


def predicted_mib(setup: Setup, checkpointing: bool) -> float:
    """What the memory model says one rank keeps for backward (layers, logits, the rest)."""
    a = setup.args
    kept = activation_bytes(
        setup.shape, a.micro_batch_size, a.precision, checkpointing, loss="chunked"
    )
    return sum(kept.values()) / 2**20


def table_rows(setup: Setup, results: dict[str, list[Measured]]) -> list[str]:
    """Two markdown rows (off, on) of one ZeRO stage."""
    if not all(results.values()):
        raise SystemExit("a launch failed (its error is above): no table")
    med = {
        row: (
            statistics.median(m.tokens_per_sec for m in ms),
            statistics.median(m.peak_gib for m in ms),
        )
        for row, ms in results.items()
    }
    (tps_off, peak_off), lines = med[OFF], []
    for row, checkpointing in ((OFF, False), (ON, True)):
        tps, peak = med[row]
        reps = " / ".join(f"{m.tokens_per_sec:,.0f}" for m in results[row])
        lines.append(
            f"| ZeRO-{setup.stage} | {'on' if checkpointing else 'off'} | {tps:,.0f} | {reps} | "
            f"{tps / tps_off:.2f} | {peak:.2f} GiB | {peak - peak_off:+.2f} GiB | "
            f"{predicted_mib(setup, checkpointing):,.0f} MiB |"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-mini", choices=list(MODEL_PRESETS))
    add_launch_options(
        p, block_size=256, micro_batch_size=16, grad_accum=1, steps=6, warmup=2, reps=1
    )
    a = parse_launch_args(p, argv)
    a.rows = [OFF, ON]  # what timed_runs.measure launches
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset = MODEL_PRESETS[args.model]
    shape = ModelShape(preset.n_layer, preset.n_head, preset.n_embd, args.block_size)
    mem = "peak GPU memory per rank" if torch.cuda.is_available() else "peak RSS per rank"
    lines = [
        f"| stage | activation checkpointing | tokens/s (median) | each repetition | "
        f"× tokens/s | {mem} | Δ peak | predicted kept for backward |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    with work_dir(args.work_dir, "gpt_ds_activation_checkpointing_") as work:
        args.data_dir = args.data_dir or prepare_shakespeare(work)
        for stage in args.stages:
            setup = Setup(args.model, stage, shape, args, work)
            lines += table_rows(setup, measure(setup, args.reps))
    print(
        f"\n{args.model}, {args.ranks} ranks, micro-batch {args.micro_batch_size} x grad-accum "
        f"{args.grad_accum}, block {args.block_size}, precision {args.precision}, "
        f"{args.steps} steps of which {args.warmup} warm-up, median of {args.reps}\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
