"""Host overhead of a training step, counted exactly on any machine: per optimizer step, the
operators that launch a kernel and the host syncs (`.item()`, `bool()`, `.tolist()`, `.cpu()`,
device synchronizes), split by phase (forward, loss, backward, DeepSpeed's step, the trainer's
own bookkeeping).

    python benchmarks/host_overhead.py                  # GPT-2 124M's depth and context
    python benchmarks/host_overhead.py --n_layer 2 --block_size 128   # a smoke run

On a GPU each launch costs ~5-10 us of host time and each sync drains the queue, so where the
host is slower than the GPU (GPT-2 124M on an H100), these counts are its step time. Each row
is a real one-rank `deepspeed` launch of gpt_ds/train.py with `--profile` (steps 3-5), bf16,
the ZeRO-2 preset, micro-batch 2, at width 128 (the count depends on the depth and the
context, not the width), the loss walked in a GPU's chunks (GPT_DS_LOSS_CHUNKS=gpu); rank 0's
trace is counted by gpt_ds.observe.step_ops ("strict leaves": operators with nothing at all
nested inside, views and allocations left out, the count of earlier measurements; it misses
e.g. `mm`, which calls `resolve_conj`). Rows:

- `gpt_ds`: the defaults;
- `gpt_ds --loss full`: GPT2LMHeadModel's own loss over the full logits;
- `DeepSpeed's bf16 defaults`: the preset with DeepSpeed's bf16 overflow check and throughput
  timer left on, as DeepSpeed ships them (what gpt_ds turns off).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

from support.launch import launch_env, run_deepspeed  # noqa: E402
from support.workspace import prepare_shakespeare, work_dir  # noqa: E402

from gpt_ds.model.training_model import CHUNKS_ENV  # noqa: E402
from gpt_ds.observe.host_syncs import CPU_SKIPPED  # noqa: E402
from gpt_ds.observe.step_ops import PHASES, StepOps, count_step_ops  # noqa: E402

ROWS = ("gpt_ds", "gpt_ds --loss full", "DeepSpeed's bf16 defaults")


def ds_defaults_config(work: Path) -> Path:
    """The ZeRO-2 preset with DeepSpeed's own bf16 overflow check and throughput timer."""
    preset = json.loads((REPO / "ds_configs" / "zero2.json").read_text())
    preset["bf16"]["check_grad_overflow"] = True
    preset["timers"] = {"throughput": {"enabled": True, "synchronized": True}}
    path = work / "zero2_ds_defaults.json"
    path.write_text(json.dumps(preset, indent=2))
    return path


def run_args(args: argparse.Namespace, row: str, data: str, out: Path) -> list[str]:
    config = ds_defaults_config(out.parent) if row.startswith("DeepSpeed") else "zero2"
    flags = {
        "deepspeed_config": config, "model": "gpt2", "n_layer": args.n_layer, "n_head": 4,
        "n_embd": 128, "block_size": args.block_size, "micro_batch_size": 2, "grad_accum": 1,
        "precision": "bf16", "max_iters": 6, "warmup_iters": 2, "eval_interval": 0,
        "eval_iters": 1, "data_dir": data, "out_dir": str(out),
        "loss": "full" if row.endswith("--loss full") else "chunked",
    }  # fmt: skip
    argv = [item for k, v in flags.items() for item in (f"--{k}", str(v))]
    return [*argv, "--profile", "--no_checkpoint"]


def measure(args: argparse.Namespace, row: str, data: str, work: Path) -> StepOps:
    out = work / row.replace(" ", "_").replace("'", "").replace("-", "")
    env = dict(launch_env(), **{CHUNKS_ENV: "gpu"})
    run_deepspeed(run_args(args, row, data, out), num_gpus=1, env=env, timeout=args.timeout)
    (trace,) = (out / "profile").glob("rank0.*.json")
    return count_step_ops(trace)


def table(results: dict[str, StepOps]) -> str:
    head = (
        "| row | "
        + " | ".join(PHASES)
        + " | kernel launches | strict leaves | host syncs | of which item/bool |"
    )
    lines = [head, "|---" * (len(PHASES) + 5) + "|"]
    for row, ops in results.items():
        cells = [f"{ops.per_step(ops.launches[p]):.0f} / {ops.per_step(ops.syncs[p]):.0f}"
                 for p in PHASES]  # fmt: skip
        lines.append(
            f"| {row} | {' | '.join(cells)} | {ops.total_launches:.0f} | "
            f"{ops.per_step(ops.strict_leaves):.0f} | {ops.total_syncs:.0f} | "
            f"{ops.local_scalar_per_step:.0f} |"
        )
    return "\n".join(lines)


def sync_sources(results: dict[str, StepOps]) -> str:
    lines = []
    for row, ops in results.items():
        kinds = sorted(ops.by_sync.items())
        lines.append(f"- {row}: " + ", ".join(f"{k} {ops.per_step(c):.0f}" for k, c in kinds))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n_layer", type=int, default=12, help="depth (GPT-2 124M: 12)")
    p.add_argument("--block_size", type=int, default=1024, help="context (GPT-2: 1024)")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    p.add_argument("--data_dir", help="prepared tokens (default: Tiny Shakespeare, prepared)")
    p.add_argument("--work_dir", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with work_dir(args.work_dir, "host_overhead_") as work:
        data = args.data_dir or prepare_shakespeare(work)
        results = {row: measure(args, row, data, work) for row in args.rows}
    print(
        f"Per optimizer step, kernel launches / host syncs by phase (bf16, ZeRO-2, 1 rank, "
        f"micro-batch 2, {args.n_layer} layers, block {args.block_size}, a GPU's loss chunks):"
    )
    print(table(results))
    print("host syncs by phase and kind:")
    print(sync_sources(results))
    print(f"not in a CPU trace (DeepSpeed does it on GPUs only): {CPU_SKIPPED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
