"""Training throughput and peak memory per rank: gpt_ds against the Hugging Face Trainer and a
bare DeepSpeed loop, with the same model, data, batch and DeepSpeed config, in one run.

    python benchmarks/throughput.py                    # gpt2-tiny, gpt2-mini x ZeRO-1/2/3
    python benchmarks/throughput.py --models gpt2-tiny --stages 2 --reps 3 --steps 30

Rows, each a real `deepspeed --num_gpus RANKS` launch:
- gpt_ds: `gpt_ds/train.py` with its defaults (no eval, no checkpoint);
- gpt_ds, each speed-up off (`--loss full`: the full logits, as GPT2LMHeadModel's own loss;
  `--vocab_multiple 1`: no vocabulary padding),
  and each opt-in one on (`--compile`, by `--rows` only; its compile time falls in the
  untimed warm-up);
- the HF Trainer and a bare loop around `deepspeed.initialize` (benchmarks/peer_trainers.py).
Repetitions are interleaved (every row once, then again, in a rotated order) and the median
is reported. Tokens/s counts the steps after `--warmup`, from the wall-clock time at the end
of each optimizer step (gpt_ds: metrics.jsonl's `time`; the peers: rank 0's step callback).
Peak memory per rank: on CPU the largest peak RSS (the kernel's VmHWM, polled) of any rank; on
GPUs the allocator's peak. MFU (GPU only) uses gpt_ds's FLOPs per token and peak table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# this checkout's gpt_ds, and the launch helpers the drill and the tests share (tests/helpers/)
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import psutil  # noqa: E402
import torch  # noqa: E402
from bench_common import prepare_shakespeare, status_bytes, work_dir  # noqa: E402
from helpers.launch import VENV_BIN, free_port, launch_env, remove_shm_buffers  # noqa: E402

from gpt_ds.dsconfig.resolve import resolve_ds_config  # noqa: E402
from gpt_ds.dsconfig.schema import load_ds_config, preset_path  # noqa: E402
from gpt_ds.model.gpt2 import MODEL_PRESETS, ModelShape, flops_per_token  # noqa: E402
from gpt_ds.observe.metrics import read_metrics  # noqa: E402
from gpt_ds.observe.peak_flops import resolve_peak  # noqa: E402
from gpt_ds.run.config import RunSettings  # noqa: E402

TRAIN = REPO / "gpt_ds" / "train.py"
PEERS = REPO / "benchmarks" / "peer_trainers.py"
LR = 6e-4
# row name -> how it is launched: gpt_ds flags, or a peer of peer_trainers.py
ROWS: dict[str, tuple[str, list[str]]] = {
    "gpt_ds": ("gpt_ds", []),
    "gpt_ds --loss full": ("gpt_ds", ["--loss", "full"]),
    "gpt_ds --vocab_multiple 1": ("gpt_ds", ["--vocab_multiple", "1"]),
    "gpt_ds --compile": ("gpt_ds", ["--compile"]),
    "gpt_ds --activation_checkpointing": ("gpt_ds", ["--activation_checkpointing"]),
    "HF Trainer": ("peer", ["--trainer", "hf"]),
    "bare DeepSpeed loop": ("peer", ["--trainer", "bare"]),
}
REFERENCE = "HF Trainer"
# --compile compiles for a minute or more per launch on a CPU: asked for by name (--rows), as
# is activation checkpointing (benchmarks/activation_checkpointing.py measures it)
DEFAULT_ROWS = [
    r for r in ROWS if r not in ("gpt_ds --compile", "gpt_ds --activation_checkpointing")
]


@dataclass
class Setup:
    """One table: a model at a ZeRO stage, and what every row runs with."""

    model: str
    stage: int
    shape: ModelShape
    args: argparse.Namespace
    work: Path
    ds_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.ds_file = self.work / f"{self.model}_zero{self.stage}.json"
        self.ds_file.write_text(json.dumps(self.resolved_config(), indent=1))

    def resolved_config(self) -> dict:
        """The preset as gpt_ds resolves it for this run: what the peers get, verbatim."""
        a = self.args
        settings = RunSettings(
            world_size=a.ranks,
            micro_batch_size=a.micro_batch_size,
            grad_accum=a.grad_accum,
            lr=LR,
            max_iters=a.steps,
            precision=a.precision,
        )
        raw = load_ds_config(preset_path(f"zero{self.stage}"))
        return resolve_ds_config(raw, settings).config

    @property
    def tokens_per_step(self) -> int:
        a = self.args
        return a.ranks * a.micro_batch_size * a.grad_accum * self.shape.block_size


@dataclass
class Measured:
    tokens_per_sec: float
    peak_gib: float  # the largest rank's


def launch_command(setup: Setup, row: str, out: Path) -> list[str]:
    a, s = setup.args, setup.shape
    kind, flags = ROWS[row]
    size = ["--n_layer", s.n_layer, "--n_head", s.n_head, "--n_embd", s.n_embd]
    size += ["--block_size", s.block_size]
    if kind == "gpt_ds":
        script = TRAIN
        rest = ["--deepspeed_config", f"zero{setup.stage}", "--model", setup.model, *size]
        rest += ["--micro_batch_size", a.micro_batch_size, "--grad_accum", a.grad_accum]
        rest += ["--max_iters", a.steps, "--lr", LR, "--precision", a.precision]
        rest += ["--eval_interval", 0, "--no_checkpoint", "--log_interval", 1]
        rest += ["--data_dir", a.data_dir, "--out_dir", out, *flags]
    else:
        script = PEERS
        rest = [*flags, "--ds_config", setup.ds_file, "--data_dir", a.data_dir, *size]
        rest += ["--steps", a.steps, "--times", out / "times.json"]
    return [str(x) for x in (script, *rest)]


def rank_pids(launcher: psutil.Process) -> list[psutil.Process]:
    """The launch's rank processes (the deepspeed launcher starts them with --local_rank)."""
    try:
        children = launcher.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [
        c
        for c in children
        if any(part.startswith("--local_rank") for part in _cmdline(c))
        and "deepspeed.launcher.launch" not in " ".join(_cmdline(c))
    ]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def run_once(setup: Setup, row: str, out: Path) -> Measured:
    """One launch of `row`; its tokens/s after warm-up and its largest per-rank peak memory."""
    out.mkdir(parents=True)
    port = free_port()
    cmd = [str(VENV_BIN / "deepspeed"), "--num_gpus", str(setup.args.ranks)]
    cmd += ["--master_port", str(port), *launch_command(setup, row, out)]
    peaks: dict[int, int] = {}
    with (out / "log.txt").open("w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=launch_env(), stdout=log, stderr=subprocess.STDOUT
        )
        launcher = psutil.Process(proc.pid)
        try:
            while proc.poll() is None:
                for p in rank_pids(launcher):
                    peaks[p.pid] = max(peaks.get(p.pid, 0), status_bytes(p.pid, "VmHWM"))
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            remove_shm_buffers("127.0.0.1", port)
    if proc.returncode != 0:
        tail = (out / "log.txt").read_text()[-4000:]
        raise SystemExit(f"{row} failed (rc {proc.returncode}): {' '.join(cmd)}\n{tail}")
    times, gpu_peak = step_times(ROWS[row][0], out)
    warm = setup.args.warmup
    if len(times) != setup.args.steps:
        raise SystemExit(f"{row}: {len(times)} step times for {setup.args.steps} steps ({out})")
    seconds = times[-1] - times[warm - 1]
    tps = (len(times) - warm) * setup.tokens_per_step / seconds
    peak = gpu_peak if gpu_peak is not None else max(peaks.values(), default=0) / 2**30
    return Measured(tps, peak)


def step_times(kind: str, out: Path) -> tuple[list[float], float | None]:
    """(wall-clock time at the end of each step, the GPU allocator's peak GiB or None)."""
    if kind == "gpt_ds":
        train = [r for r in read_metrics(out) if "tokens_per_sec" in r]
        gpu = max(r["peak_mem_gib"] for r in train) if torch.cuda.is_available() else None
        return [r["time"] for r in train], gpu
    data = json.loads((out / "times.json").read_text())
    return data["times"], data.get("peak_gpu_gib")


def measure(setup: Setup, reps: int) -> dict[str, list[Measured]]:
    """Every row `reps` times, interleaved: rep r starts at row r (rotation)."""
    rows = setup.args.rows
    results: dict[str, list[Measured]] = {r: [] for r in rows}
    for rep in range(reps):
        for row in rows[rep % len(rows) :] + rows[: rep % len(rows)]:
            out = setup.work / f"{setup.model}_z{setup.stage}_{rep}_{row.replace(' ', '_')}"
            results[row].append(m := run_once(setup, row, out))
            print(
                f"  {setup.model} ZeRO-{setup.stage} rep {rep + 1}: {row:<22} "
                f"{m.tokens_per_sec:9,.0f} tok/s  peak {m.peak_gib:.2f} GiB",
                flush=True,
            )
    return results


def table(setup: Setup, results: dict[str, list[Measured]]) -> str:
    """Markdown: median tokens/s, each repetition, peak memory, ratios to the HF Trainer."""
    med = {
        r: (
            statistics.median(m.tokens_per_sec for m in ms),
            statistics.median(m.peak_gib for m in ms),
        )
        for r, ms in results.items()
    }
    ref_tps, ref_mem = med.get(REFERENCE, (float("nan"), float("nan")))
    peak, _ = resolve_peak(None)
    mfu_head = " MFU |" if peak else ""
    mem = "peak GPU memory per rank" if torch.cuda.is_available() else "peak RSS per rank"
    lines = [
        f"**{setup.model}, ZeRO-{setup.stage}**",
        "",
        f"| trainer | tokens/s (median) | each repetition | {mem} | × HF tok/s | × HF memory |"
        + mfu_head,
        "|---|---:|---|---:|---:|---:|" + ("---:|" if peak else ""),
    ]
    for row, ms in results.items():
        tps, gib = med[row]
        reps = " / ".join(f"{m.tokens_per_sec:,.0f}" for m in ms)
        line = (
            f"| {row} | {tps:,.0f} | {reps} | {gib:.2f} GiB | {tps / ref_tps:.2f} | "
            f"{gib / ref_mem:.2f} |"
        )
        if peak:
            mfu = tps * flops_per_token(setup.shape) / (peak * setup.args.ranks)
            line += f" {mfu * 100:.1f}% |"
        lines.append(line)
    return "\n".join(lines)


def add_launch_options(
    p: argparse.ArgumentParser, *, block_size: int, micro_batch_size: int, grad_accum: int,
    steps: int, warmup: int, reps: int,
) -> None:  # fmt: skip
    """The flags `measure` reads from Setup.args, at a benchmark's own defaults
    (activation_checkpointing.py launches through `measure` too)."""
    p.add_argument("--stages", nargs="+", type=int, default=[1, 2, 3], choices=[1, 2, 3])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--block_size", type=int, default=block_size)
    p.add_argument("--micro_batch_size", type=int, default=micro_batch_size)
    p.add_argument("--grad_accum", type=int, default=grad_accum)
    p.add_argument(
        "--precision",
        choices=["bf16", "fp16", "fp32"],
        default="bf16" if torch.cuda.is_available() else "fp32",
        help="default: bf16 on GPUs, fp32 on CPU",
    )
    p.add_argument("--steps", type=int, default=steps, help="optimizer steps per launch")
    p.add_argument("--warmup", type=int, default=warmup, help="steps not timed")
    p.add_argument("--reps", type=int, default=reps, help="interleaved repetitions")
    p.add_argument("--data_dir", help="a prepared data dir (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", help="keep every launch's log and output here")


def parse_launch_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`p`'s arguments, the launch options checked."""
    a = p.parse_args(argv)
    if not 1 <= a.warmup < a.steps:
        p.error("--warmup must be at least 1 and below --steps")
    return a


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        help="which rows (default all but gpt_ds --compile and --activation_checkpointing): "
        + ", ".join(map(repr, ROWS)),
    )
    return parse_launch_args(p, argv)


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
                tables.append(table(setup, measure(setup, args.reps)))
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
