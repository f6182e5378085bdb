"""Training throughput and peak memory per rank: gpt_ds against the Hugging Face Trainer, a
bare DeepSpeed loop and plain PyTorch loops, with the same model, data, batch and settings, in
one run.

    python benchmarks/throughput.py                    # gpt2-tiny, gpt2-mini x ZeRO-1/2/3
    python benchmarks/throughput.py --models gpt2-tiny --stages 2 --reps 3 --steps 30

Rows, each a real `deepspeed --num_gpus RANKS` launch:
- gpt_ds: `gpt_ds/train.py` with its defaults (no eval, no checkpoint);
- gpt_ds with each other loss kind (`--loss deepspeed`: DeepSpeed's chunked cross-entropy over
  the logits; `--loss full`: the fp32 logits whole, as GPT2LMHeadModel's own loss), each
  speed-up off (`--vocab_multiple 1`: no vocabulary padding; `unfused AdamW`: torch's AdamW,
  neither fused nor DeepSpeed's FusedAdam), and each opt-in one on (`--compile`, by `--rows`
  only; its compile time falls in the untimed warm-up); by `--rows` only, `gpt_ds without ZeRO
  (stage 0)`: DeepSpeed's plain data-parallel engine, whatever the table's stage;
- in a bf16 (or fp16) table, `gpt_ds --precision fp32`: the same run in fp32, so that the
  table shows what the 16-bit path gains (`--precision bf16 --rows gpt_ds "gpt_ds --precision
  fp32" "HF Trainer"` is issue 24's mixed-precision table);
- the HF Trainer and a bare loop around `deepspeed.initialize` (benchmarks/peer_trainers.py);
- the anchor, plain PyTorch without DeepSpeed by nanoGPT's recipe (benchmarks/plain_loop.py):
  a minimal GPT-2 written there, and GPT2LMHeadModel, each taking its loss inside the model
  that torch.compile wraps (nanoGPT's `model(idx, targets)`); bf16 autocast in a bf16 table, fused
  AdamW and torch.compile on GPUs (compiled on CPU by `--plain_compile on`), DDP over the
  ranks. Under each table: gpt_ds's tokens/s as a multiple of the fastest of them, and how
  each ran.
Repetitions are interleaved (every row once, then again, in a rotated order) and the median
is reported. Tokens/s counts the steps after `--warmup`, from the wall-clock time at the end
of each optimizer step (gpt_ds: metrics.jsonl's `time`; the peers: rank 0's step callback).
Peak memory per rank: on CPU the largest peak RSS (the kernel's VmHWM, polled) of any rank; on
GPUs the allocator's peak. MFU (GPU only) uses gpt_ds's FLOPs per token and peak table.
The launches and their timing live in support/timed_runs.py (activation_checkpointing.py uses
them too); the peers get the DeepSpeed config the trainer's own planning chain resolves for the
gpt_ds row.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

import torch  # noqa: E402
from support.launch import planned  # noqa: E402
from support.timed_runs import (  # noqa: E402
    FUSED_CHUNKS,
    NO_ZERO,
    ROWS,
    Measured,
    Setup,
    add_launch_options,
    launch_command,
    measure,
    parse_launch_args,
)
from support.workspace import prepare_shakespeare, work_dir  # noqa: E402

from gpt_ds.model.gpt2 import MODEL_PRESETS, ModelShape, flops_per_token  # noqa: E402
from gpt_ds.observe.metrics import resolve_peak  # noqa: E402

REFERENCE = "HF Trainer"
FP32_ROW = "gpt_ds --precision fp32"  # in a table of another precision only
# --compile adds its compile to every CPU launch (a 13.4 s first iteration for gpt2-tiny,
# BENCHMARKS.md) and gained nothing there: asked for by name (--rows), as
# are activation checkpointing (benchmarks/activation_checkpointing.py measures it), --compile
# off (on a CPU the default itself) and stage 0 (the same run in every stage's table; gpu_check.py
# names those two)
BY_NAME_ONLY = (
    FUSED_CHUNKS,  # compiles each chunk's body: a GPU row (gpu_check.py names it)
    "gpt_ds --compile",
    "gpt_ds --compile off",
    "gpt_ds --activation_checkpointing",
    NO_ZERO,
)
DEFAULT_ROWS = [r for r in ROWS if r not in BY_NAME_ONLY]


def table(setup: Setup, results: dict[str, list[Measured]]) -> str:
    """Markdown: median tokens/s, each repetition, peak memory, ratios to the HF Trainer; on
    GPUs also MFU and the memory model's prediction; under it, gpt_ds against the plain loops."""
    med = {
        r: (
            statistics.median(m.tokens_per_sec for m in ms),
            statistics.median(m.peak_gib for m in ms),
        )
        for r, ms in results.items()
        if ms
    }
    ref_tps, ref_mem = med.get(REFERENCE, (float("nan"), float("nan")))
    extra = gpu_columns(setup)
    mem = "peak GPU memory per rank" if torch.cuda.is_available() else "peak RSS per rank"
    lines = [
        f"**{setup.model}, ZeRO-{setup.stage}**",
        "",
        f"| trainer | tokens/s (median) | each repetition | {mem} | × HF tok/s | × HF memory |"
        + "".join(f" {head} |" for head in extra),
        "|---|---:|---|---:|---:|---:|" + "---:|" * len(extra),
    ]
    for row, ms in results.items():
        if not ms:
            lines.append(f"| {row} | failed (its error is above) | | | | |")
            continue
        tps, gib = med[row]
        reps = " / ".join(f"{m.tokens_per_sec:,.0f}" for m in ms)
        line = (
            f"| {row} | {tps:,.0f} | {reps} | {gib:.2f} GiB | {ratio(tps, ref_tps)} | "
            f"{ratio(gib, ref_mem)} |"
        )
        lines.append(line + "".join(f" {cell(row, tps)} |" for cell in extra.values()))
    return "\n".join(lines + anchor(med, results))


def ratio(value: float, reference: float) -> str:
    """`value` as a multiple of `reference`; "-" where the reference row did not run."""
    return "-" if math.isnan(reference) else f"{value / reference:.2f}"


def anchor(med: dict[str, tuple[float, float]], results: dict[str, list[Measured]]) -> list[str]:
    """gpt_ds's tokens/s as a multiple of the fastest plain PyTorch loop's (what a loop with no
    framework at all reaches), and how each plain loop ran; nothing without a plain row."""
    plain = [r for r in med if ROWS[r][0] == "plain"]
    lines = [f"- {r}: {results[r][0].note}" for r in plain]
    if plain and "gpt_ds" in med:
        fastest = max(plain, key=lambda r: med[r][0])
        ratio = med["gpt_ds"][0] / med[fastest][0]
        lines.insert(0, f"- gpt_ds: {ratio:.2f}× the tokens/s of the fastest plain loop, {fastest}")
    return ["", *lines] if lines else []


def gpu_columns(setup: Setup) -> dict[str, Callable[[str, float], str]]:
    """Header -> cell of (row, tokens/s): MFU where the device's peak is known, and on GPUs
    the peak the trainer's memory model predicts for a gpt_ds row (the peers: -)."""
    columns: dict[str, Callable[[str, float], str]] = {}
    peak, _ = resolve_peak(
        None, torch.cuda.get_device_name() if torch.cuda.is_available() else None
    )
    if peak:
        per_token = flops_per_token(setup.shape)
        columns["MFU"] = lambda _row, tps: f"{tps * per_token / (peak * setup.args.ranks):.1%}"
    if torch.cuda.is_available():
        columns["predicted peak"] = lambda row, _tps: predicted_peak(setup, row)
    return columns


def predicted_peak(setup: Setup, row: str) -> str:
    """The trainer's own predicted per-rank GPU peak for a gpt_ds row, planned here."""
    if ROWS[row][0] != "gpt_ds":
        return "-"
    argv = launch_command(setup, row, setup.work / "plan")[1:]  # the flags, not the script
    return f"{planned(argv, setup.args.ranks).estimate.total / 2**30:.2f} GiB"


def result_writer(path: Path | None, setup: Setup) -> Callable[[str, int, Measured], None] | None:
    """Appends each measured repetition to `path` as it comes, flushed: one JSON line and,
    beside it (`path` with .md), one markdown row, so a run stopped by a time limit keeps
    every figure it had."""
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(row: str, rep: int, m: Measured) -> None:
        record = {
            "model": setup.model,
            "zero_stage": setup.stage,
            "row": row,
            "rep": rep + 1,
            "tokens_per_sec": round(m.tokens_per_sec, 1),
            "peak_gib": round(m.peak_gib, 3),
            "note": m.note,
        }
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        with path.with_suffix(".md").open("a") as f:
            f.write(
                f"| {setup.model} ZeRO-{setup.stage} | {row} | {rep + 1} | "
                f"{m.tokens_per_sec:,.0f} | {m.peak_gib:.2f} GiB |\n"
            )

    return write


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models", nargs="+", default=["gpt2-tiny", "gpt2-mini"], choices=list(MODEL_PRESETS)
    )
    add_launch_options(
        p, block_size=128, micro_batch_size=4, grad_accum=2, steps=20, warmup=5, reps=2
    )
    p.add_argument(
        "--rows",
        nargs="+",
        default=DEFAULT_ROWS,
        choices=list(ROWS),
        metavar="ROW",
        help="which rows (default all but " + ", ".join(map(repr, BY_NAME_ONLY)) + "; "
        f"{FP32_ROW!r} only in a table of another precision): " + ", ".join(map(repr, ROWS)),
    )
    p.add_argument(
        "--plain_compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="torch.compile the plain PyTorch rows: auto where inductor pays off (GPUs), on "
        "also on CPU (about a minute per launch, in the untimed warm-up)",
    )
    p.add_argument(
        "--results",
        type=Path,
        help="append each repetition as it is measured: a JSON line to this file, a markdown "
        "row to the same name with .md (kept when the run is cut short)",
    )
    args = parse_launch_args(p, argv)
    if args.precision == "fp32" and FP32_ROW in args.rows:  # the gpt_ds row itself
        args.rows = [r for r in args.rows if r != FP32_ROW]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with work_dir(args.work_dir, "gpt_ds_throughput_") as work:
        args.data_dir = args.data_dir or prepare_shakespeare(work)
        tables = []
        for model in args.models:
            shape = MODEL_PRESETS[model]
            shape = ModelShape(shape.n_layer, shape.n_head, shape.n_embd, args.block_size)
            for stage in args.stages:
                setup = Setup(model, stage, shape, args, work)
                measured = measure(setup, args.reps, result_writer(args.results, setup))
                tables.append(table(setup, measured))
        print(
            f"\n{args.ranks} ranks, micro-batch {args.micro_batch_size} x grad-accum "
            f"{args.grad_accum}, block {args.block_size}, precision "
            f"{args.precision}, {args.steps} steps of which {args.warmup} warm-up, "
            f"median of {args.reps} interleaved repetitions\n"
        )
        print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
