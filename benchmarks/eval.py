"""Distributed evaluation: the same validation windows scored by 1 rank and by 2 ranks (and by
1 rank with 2 threads), seconds, tokens/s and the val loss of each, in one run.

    python benchmarks/eval.py                          # gpt2-tiny, ZeRO-2, 160 windows of 256
    python benchmarks/eval.py --reps 3 --eval_iters 40 --stage 3

Each row is a real `deepspeed --num_gpus RANKS benchmarks/eval.py` launch whose ranks run the
product's path: `Trainer.setup()` (the seeded model, `deepspeed.initialize` with the resolved
preset, exactly as `gpt_ds/train.py` builds them) and `Trainer.evaluate`, which calls
`gpt_ds.training.evaluation.evaluate` with `eval_iters x micro_batch_size` fixed windows. The
model is freshly initialised from `--seed`, so every world size scores identical weights: the losses
must agree to float rounding (the table gives each one's difference from 1 rank's). One
evaluation warms up (allocations, first kernels), a barrier, then one timed evaluation.
Ranks run with OMP_NUM_THREADS=1 (support/launch.py) unless the row says otherwise.
Repetitions are interleaved (rotated order) and the median is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

from support.launch import launch_env, run_deepspeed  # noqa: E402
from support.workspace import interleaved, prepare_shakespeare, work_dir  # noqa: E402

# row name -> (ranks, threads per rank)
ROWS: dict[str, tuple[int, int]] = {
    "1 rank": (1, 1),
    "2 ranks": (2, 1),
    "1 rank, 2 threads": (1, 2),
}
REFERENCE = "1 rank"


@dataclass
class Measured:
    seconds: float
    tokens: int
    loss: float

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / self.seconds


# --------------------------------------------------------------------------- one launch's ranks


def eval_worker(result: Path, run_args: list[str]) -> None:
    """On every rank: set up as `gpt_ds/train.py` does, evaluate once to warm up, then once
    timed; rank 0 writes {seconds, tokens, loss} to `result`."""
    import torch

    from gpt_ds.base import dist
    from gpt_ds.launch.machine import probe_machine
    from gpt_ds.run.config import parse_args
    from gpt_ds.run.plan import plan_run
    from gpt_ds.training.trainer import Trainer

    plan = plan_run(parse_args(run_args), probe_machine())  # the trainer's own planning chain
    cfg, ds, shape = plan.cfg, plan.ds, plan.shape
    dist.init()
    try:
        trainer = Trainer(plan)
        trainer.setup()
        trainer.evaluate(0)  # warm-up
        dist.barrier()
        start = time.perf_counter()
        trainer.evaluate(1)  # timed
        seconds = time.perf_counter() - start
        windows = cfg.eval_iters * ds.micro_batch_size * ds.grad_accum
        if dist.is_main():
            out = {"seconds": seconds, "tokens": windows * shape.block_size,
                   "loss": trainer.last_val, "threads": torch.get_num_threads()}  # fmt: skip
            result.write_text(json.dumps(out))
    finally:
        dist.shutdown()


# --------------------------------------------------------------------------- the launches


def run_args(args: argparse.Namespace, out: Path) -> list[str]:
    """`gpt_ds/train.py` flags for the ranks: the model, the preset, the windows, the data."""
    flags = {
        "model": args.model,
        "deepspeed_config": f"ds_configs/zero{args.stage}.json",
        "block_size": args.block_size,
        "micro_batch_size": args.micro_batch_size,
        "grad_accum": 1,
        "eval_iters": args.eval_iters,
        "precision": args.precision,
        "seed": 1337,
        "data_dir": args.data_dir,
        "out_dir": out,
    }
    return [str(x) for k, v in flags.items() for x in (f"--{k}", v)]


def run_once(args: argparse.Namespace, row: str, out: Path) -> Measured:
    """One `deepspeed` launch of `row`; its timed evaluation as rank 0 measured it."""
    ranks, threads = ROWS[row]
    out.mkdir(parents=True)
    worker = ["--eval_worker", str(out / "result.json"), *run_args(args, out)]
    env = {**launch_env(), "OMP_NUM_THREADS": str(threads)}
    proc = run_deepspeed(
        worker, num_gpus=ranks, script=Path(__file__), timeout=3600, check=False, env=env
    )
    log = proc.stdout + proc.stderr
    (out / "log.txt").write_text(log)
    if proc.returncode != 0 or not (out / "result.json").exists():
        raise SystemExit(
            f"{row} failed (rc {proc.returncode}): {' '.join(proc.args)}\n{log[-4000:]}"
        )
    r = json.loads((out / "result.json").read_text())
    return Measured(r["seconds"], r["tokens"], r["loss"])


def measure(args: argparse.Namespace, work: Path) -> dict[str, list[Measured]]:
    """Every row `reps` times, interleaved: rep r starts at row r (rotation)."""
    rows = list(ROWS)
    results: dict[str, list[Measured]] = {r: [] for r in rows}
    for rep, row in interleaved(rows, args.reps):
        out = work / f"rep{rep}_{row.replace(' ', '_').replace(',', '')}"
        results[row].append(m := run_once(args, row, out))
        print(
            f"  rep {rep + 1}: {row:<18} {m.tokens_per_sec:9,.0f} tok/s  "
            f"{m.seconds:6.2f} s  val loss {m.loss:.10f}",
            flush=True,
        )
    return results


def table(results: dict[str, list[Measured]]) -> str:
    """Markdown: median seconds and tokens/s, × 1 rank, each row's loss and its difference."""
    ref = results[REFERENCE]
    ref_tps = statistics.median(m.tokens_per_sec for m in ref)
    lines = [
        "| evaluation | tokens | seconds (median) | tokens/s | each repetition | × 1 rank "
        "| val loss | − 1 rank's loss |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for row, ms in results.items():
        tps = statistics.median(m.tokens_per_sec for m in ms)
        seconds = statistics.median(m.seconds for m in ms)
        reps = " / ".join(f"{m.tokens_per_sec:,.0f}" for m in ms)
        diff = max((m.loss - ref[0].loss for m in ms), key=abs)
        lines.append(
            f"| {row} | {ms[0].tokens:,} | {seconds:.2f} | {tps:,.0f} | {reps} | "
            f"{tps / ref_tps:.2f} | {ms[0].loss:.8f} | {diff:+.2e} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-tiny")
    p.add_argument("--stage", type=int, default=2, choices=[1, 2, 3], help="ZeRO preset")
    p.add_argument("--block_size", type=int, default=256)
    p.add_argument("--micro_batch_size", type=int, default=8)
    p.add_argument("--eval_iters", type=int, default=20, help="windows: this x micro-batch")
    p.add_argument("--precision", default="fp32", help="fp32 (default: the tightest check)")
    p.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    p.add_argument("--data_dir", help="a prepared data dir (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", help="keep every launch's log and output here")
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error("--reps must be >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with work_dir(args.work_dir, "gpt_ds_eval_") as work:
        args.data_dir = args.data_dir or prepare_shakespeare(work)
        results = measure(args, work)
        print(
            f"\n{args.model}, ZeRO-{args.stage}, {args.precision}, "
            f"{args.eval_iters * args.micro_batch_size} windows of {args.block_size} tokens "
            f"(micro-batch {args.micro_batch_size}), {os.cpu_count()} CPUs, median of "
            f"{args.reps} interleaved repetitions\n"
        )
        print(table(results))
    return 0


def worker_main(argv: list[str]) -> None:
    """A rank of a launch: `--eval_worker RESULT` and train.py flags (and --local_rank)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--eval_worker", type=Path, required=True)
    known, rest = p.parse_known_args(argv)
    eval_worker(known.eval_worker, rest)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as gpt_ds/train.py: no C++ teardown once the work is done (exit_now)


if __name__ == "__main__":
    if "--eval_worker" in sys.argv:
        worker_main(sys.argv[1:])
    sys.exit(main())
