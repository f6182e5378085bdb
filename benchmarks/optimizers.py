"""Muon against AdamW on the same tokens: final val loss over seeds, tokens to AdamW's final val
loss, tokens/s and peak memory, each optimizer at the best lr of a short sweep.

    python benchmarks/optimizers.py                      # gpt2-mini, Tiny Shakespeare, 2 ranks
    python benchmarks/optimizers.py --data_dir data/fineweb_edu_10b --max_iters 2000
    python benchmarks/optimizers.py --model gpt2-tiny --max_iters 8 --seeds 1 \\
        --adamw_lrs 6e-4 --muon_lrs 0.02                 # a smoke run

Every run is a real `deepspeed --num_gpus RANKS gpt_ds/train.py` launch with the same model,
data, batch, tokens and schedule shape (cosine, the same warm-up and decay to lr/10); only the
optimizer and its lr differ. The sweep runs each lr once at the first seed and keeps the one
with the lowest final val loss; the other seeds then run at it. Muon's runs keep their AdamW
half (wte, wpe, biases, LayerNorms) at AdamW's chosen lr and sweep `--muon_lr`. "Tokens to
AdamW's final" is where each run's val-loss curve (evaluated every --eval_interval steps, read
between evaluations linearly) first reaches the mean final val loss of AdamW's seeds; "-"
where it never does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

import torch  # noqa: E402
from support.launch import TRAIN, run_deepspeed  # noqa: E402
from support.workspace import prepare_shakespeare, work_dir  # noqa: E402

from gpt_ds.model.gpt2 import MODEL_PRESETS  # noqa: E402

OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class Run:
    """One finished launch, read from its metrics.jsonl."""

    optimizer: str
    lr: float
    seed: int
    curve: list[tuple[int, float]]  # (tokens, val loss) at each evaluation
    tokens_per_sec: float  # median over the logged steps after the first
    peak_gib: float  # the largest per-rank peak the trainer logged

    @property
    def final(self) -> float:
        return self.curve[-1][1]

    def tokens_to(self, target: float) -> float | None:
        """Tokens where the val-loss curve first reaches `target` (linear between evals)."""
        for (t0, l0), (t1, l1) in zip(self.curve, self.curve[1:], strict=False):
            if l1 <= target:
                return t1 if l0 <= l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
        return None


def read_run(out: Path, optimizer: str, lr: float, seed: int) -> Run:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["tokens"], r["val_loss"]) for r in records if r.get("kind") == "eval"]
    train = [r for r in records if r.get("kind") == "train"]
    if not evals or not train:
        raise SystemExit(f"{out}: no evaluation or training record (its log is beside it)")
    speeds = [r["tokens_per_sec"] for r in train[1:]] or [train[0]["tokens_per_sec"]]
    peak = max(r.get("peak_mem_gib") or 0.0 for r in train)
    return Run(optimizer, lr, seed, evals, statistics.median(speeds), peak)


def train(
    args: argparse.Namespace, work: Path, optimizer: str, lr: float, seed: int, adamw_lr: float
) -> Run:
    """One launch; its log and out dir under `work`."""
    name = f"{optimizer}_lr{lr:g}_seed{seed}"
    flags = {
        "model": args.model, "block_size": args.block_size, "precision": args.precision,
        "micro_batch_size": args.micro_batch_size, "grad_accum": args.grad_accum,
        "max_iters": args.max_iters, "warmup_iters": args.warmup_iters,
        "lr_schedule": "cosine", "eval_interval": args.eval_interval,
        "eval_iters": args.eval_iters, "log_interval": 1, "seed": seed,
        "deepspeed_config": args.deepspeed_config, "optimizer": optimizer,
        "lr": adamw_lr if optimizer == "muon" else lr, "no_checkpoint": True,
        "data_dir": args.data_dir, "out_dir": work / name,
    }  # fmt: skip
    if optimizer == "muon":
        flags["muon_lr"] = lr
    argv = []
    for key, value in flags.items():
        argv += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    proc = run_deepspeed([*argv], num_gpus=args.ranks, script=TRAIN, timeout=args.timeout)
    (work / f"{name}.log").write_text(proc.stdout + proc.stderr)
    run = read_run(work / name, optimizer, lr, seed)
    print(f"  {name}: final val loss {run.final:.4f}, {run.tokens_per_sec:,.0f} tokens/s")
    return run


def sweep(args, work: Path, optimizer: str, lrs: list[float], adamw_lr: float) -> list[Run]:
    """Each lr at the first seed; then the other seeds at the best. Returns the best lr's runs
    (the sweep's are printed as they finish)."""
    first = [train(args, work, optimizer, lr, args.first_seed, adamw_lr) for lr in lrs]
    best = min(first, key=lambda r: r.final)
    seeds = range(args.first_seed + 1, args.first_seed + args.seeds)
    return [best] + [train(args, work, optimizer, best.lr, s, adamw_lr) for s in seeds]


def row(name: str, runs: list[Run], target: float, tokens: int) -> str:
    finals = [r.final for r in runs]
    spread = f"± {statistics.stdev(finals):.4f}" if len(finals) > 1 else "(1 seed)"
    reached = [r.tokens_to(target) for r in runs]
    if all(t is not None for t in reached):
        mean = statistics.mean(t for t in reached if t is not None)
        to_target = f"{mean:,.0f} ({mean / tokens:.0%})"
    else:
        to_target = f"- ({sum(t is not None for t in reached)} of {len(runs)} seeds reach it)"
    tps = statistics.median(r.tokens_per_sec for r in runs)
    peak = max(r.peak_gib for r in runs)
    return (
        f"| {name} | {runs[0].lr:g} | {len(runs)} | {statistics.mean(finals):.4f} {spread} | "
        f"{to_target} | {tps:,.0f} | {peak:.2f} GiB |"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-mini", choices=list(MODEL_PRESETS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--deepspeed_config", default="zero2")
    p.add_argument("--block_size", type=int, default=128)
    p.add_argument("--micro_batch_size", type=int, default=8)
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--max_iters", type=int, default=100, help="the same steps for every run")
    p.add_argument("--warmup_iters", type=int, default=10)
    p.add_argument("--eval_interval", type=int, default=10)
    p.add_argument("--eval_iters", type=int, default=5)
    p.add_argument(
        "--precision",
        choices=["bf16", "fp32"],
        default="bf16" if torch.cuda.is_available() else "fp32",
        help="default: bf16 on GPUs, fp32 on CPU",
    )
    p.add_argument("--seeds", type=int, default=3, help="seeds at each optimizer's best lr")
    p.add_argument("--first_seed", type=int, default=1337)
    p.add_argument("--adamw_lrs", type=float, nargs="+", default=[6e-4, 1.2e-3, 2.4e-3])
    p.add_argument("--muon_lrs", type=float, nargs="+", default=[0.01, 0.02, 0.04])
    p.add_argument("--data_dir", help="a prepared data dir (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", help="keep every launch's log and output here")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per launch")
    a = p.parse_args(argv)
    if a.seeds < 1 or a.max_iters < 1 or a.eval_interval < 1:
        p.error("--seeds, --max_iters and --eval_interval must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tokens = args.max_iters * args.ranks * args.micro_batch_size * args.grad_accum
    tokens *= args.block_size
    with work_dir(args.work_dir, "gpt_ds_optimizers_") as work:
        args.data_dir = args.data_dir or prepare_shakespeare(work)
        print(f"AdamW, lr sweep {args.adamw_lrs}:")
        adamw = sweep(args, work, "adamw", args.adamw_lrs, adamw_lr=0.0)
        print(f"Muon (its AdamW half at lr {adamw[0].lr:g}), muon_lr sweep {args.muon_lrs}:")
        muon = sweep(args, work, "muon", args.muon_lrs, adamw_lr=adamw[0].lr)
    target = statistics.mean(r.final for r in adamw)
    print(
        f"\n{args.model} on {Path(args.data_dir).name}, {args.ranks} ranks, "
        f"{args.deepspeed_config}, {args.precision}, {tokens:,} tokens ({args.max_iters} steps "
        f"of {tokens // args.max_iters:,}), cosine with {args.warmup_iters} warm-up steps; "
        f"AdamW's final val loss {target:.4f} is the target\n"
    )
    print(
        "| optimizer | lr (best of the sweep) | seeds | final val loss (mean ± sd) | "
        "tokens to AdamW's final | tokens/s (median) | peak memory per rank |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(row("AdamW", adamw, target, tokens))
    print(row("Muon (muon_lr; AdamW half at AdamW's lr)", muon, target, tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
