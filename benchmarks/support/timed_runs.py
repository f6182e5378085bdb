"""Timed launches of gpt_ds and of its peers (benchmarks/peer_trainers.py on DeepSpeed,
benchmarks/plain_loop.py without it): what benchmarks/throughput.py and
benchmarks/activation_checkpointing.py measure.

`Setup` is one table (a model at a ZeRO stage); `measure` launches each of its rows `--reps`
times, interleaved, and returns tokens/s after the warm-up and the largest rank's peak memory
(peak RSS on CPU, the allocator's peak on GPUs) of every launch, and the note a plain loop
leaves on how it ran. The peers get the DeepSpeed config gpt_ds's own planning chain
(gpt_ds.run.plan.plan_run) resolves for the gpt_ds row; the plain loops take its batch and
optimizer settings.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpt_ds.dsconfig.schema import load_ds_config, preset_path
from gpt_ds.model.gpt2 import ModelShape
from gpt_ds.model.training_model import FUSED_ENV
from gpt_ds.observe.metrics_file import read_metrics
from support.launch import REPO, TRAIN, planned
from support.peak_rss import run_watched
from support.workspace import interleaved

PEERS = REPO / "benchmarks" / "peer_trainers.py"
PLAIN = REPO / "benchmarks" / "plain_loop.py"
LR = 6e-4
UNFUSED_ADAMW = "gpt_ds unfused AdamW"
NO_ZERO = "gpt_ds without ZeRO (stage 0)"
FUSED_CHUNKS = "gpt_ds fused loss chunks"
# row name -> how it is launched: gpt_ds flags, a peer of peer_trainers.py, or a loop of
# plain_loop.py
ROWS: dict[str, tuple[str, list[str]]] = {
    "gpt_ds": ("gpt_ds", []),
    "gpt_ds --loss deepspeed": ("gpt_ds", ["--loss", "deepspeed"]),
    "gpt_ds --loss full": ("gpt_ds", ["--loss", "full"]),
    "gpt_ds --vocab_multiple 1": ("gpt_ds", ["--vocab_multiple", "1"]),
    "gpt_ds --compile": ("gpt_ds", ["--compile"]),  # on CPU ranks too (auto: GPUs only)
    "gpt_ds --compile off": ("gpt_ds", ["--compile", "off"]),  # on GPUs: eager, as before auto
    # in a bf16 table: the same run in fp32 (bf16's gain over it), the peers staying in bf16
    "gpt_ds --precision fp32": ("gpt_ds", ["--precision", "fp32"]),
    # runs Setup's preset with torch's AdamW, neither fused nor DeepSpeed's FusedAdam
    UNFUSED_ADAMW: ("gpt_ds", []),
    # DeepSpeed at stage 0 (Setup's stage0_preset): plain data parallelism, one GPU's whole
    # optimizer, the Adam(W) gpt_ds picks (fused where it can build one)
    NO_ZERO: ("gpt_ds", []),
    "gpt_ds --activation_checkpointing": ("gpt_ds", ["--activation_checkpointing"]),
    # the defaults with each loss chunk's body compiled by inductor (ROW_ENV)
    FUSED_CHUNKS: ("gpt_ds", []),
    "HF Trainer": ("peer", ["--trainer", "hf"]),
    "bare DeepSpeed loop": ("peer", ["--trainer", "bare"]),
    # no DeepSpeed: the anchor, torch.compile'd where inductor pays off (args.plain_compile)
    "plain PyTorch (nanoGPT recipe)": ("plain", ["--model", "nanogpt"]),
    "plain PyTorch (GPT2LMHeadModel)": ("plain", ["--model", "hf"]),
}

# rows that differ from another only in an environment variable the ranks read
ROW_ENV: dict[str, dict[str, str]] = {FUSED_CHUNKS: {FUSED_ENV: "1"}}


@dataclass
class Setup:
    """One table: a model at a ZeRO stage, and what every row runs with."""

    model: str
    stage: int
    shape: ModelShape
    args: argparse.Namespace
    work: Path
    ds_file: Path = field(init=False)
    unfused_preset: Path = field(init=False)
    stage0_preset: Path = field(init=False)

    def __post_init__(self) -> None:
        self.unfused_preset = self.work / f"zero{self.stage}_unfused_adamw.json"
        preset = load_ds_config(preset_path(f"zero{self.stage}"))
        preset["optimizer"]["params"].update(torch_adam=True, fused=False, foreach=False)
        self.unfused_preset.write_text(json.dumps(preset, indent=1))
        self.stage0_preset = self.work / "zero0.json"  # ds_configs/ has no stage-0 preset
        preset = load_ds_config(preset_path("zero1"))
        preset["zero_optimization"] = {"stage": 0}
        self.stage0_preset.write_text(json.dumps(preset, indent=1))
        self.ds_file = self.work / f"{self.model}_zero{self.stage}.json"
        self.ds_file.write_text(json.dumps(self.resolved_config(), indent=1))

    def preset(self, row: str) -> Path | str:
        """The DeepSpeed config a gpt_ds row runs with: the table's ZeRO preset, or its
        stage-0 or unfused-AdamW variant."""
        variants = {UNFUSED_ADAMW: self.unfused_preset, NO_ZERO: self.stage0_preset}
        return variants.get(row, f"zero{self.stage}")

    def resolved_config(self) -> dict:
        """The DeepSpeed config the gpt_ds row runs with, from the trainer's own planning chain
        on that row's flags: what the peers get, verbatim."""
        argv = launch_command(self, "gpt_ds", self.work / "plan")[1:]  # the flags, not the script
        return planned(argv, self.args.ranks).ds.config

    @property
    def tokens_per_step(self) -> int:
        a = self.args
        return a.ranks * a.micro_batch_size * a.grad_accum * self.shape.block_size


class RowFailed(Exception):
    """A launch that failed or timed no steps: the table marks the row, the others run."""


@dataclass
class Measured:
    tokens_per_sec: float
    peak_gib: float  # the largest rank's
    note: str = ""  # how a plain loop ran (precision, compiled or eager)


def launch_command(setup: Setup, row: str, out: Path) -> list[str]:
    """The script `row` launches and its flags (a plain loop's compile choice from
    args.plain_compile, which only the benchmarks with plain rows define)."""
    a, s = setup.args, setup.shape
    kind, flags = ROWS[row]
    size = ["--n_layer", s.n_layer, "--n_head", s.n_head, "--n_embd", s.n_embd]
    size += ["--block_size", s.block_size]
    if kind == "gpt_ds":
        script = TRAIN
        rest = ["--deepspeed_config", setup.preset(row), "--model", setup.model, *size]
        rest += ["--micro_batch_size", a.micro_batch_size, "--grad_accum", a.grad_accum]
        rest += ["--max_iters", a.steps, "--lr", LR, "--precision", a.precision]
        rest += ["--eval_interval", 0, "--no_checkpoint", "--log_interval", 1]
        rest += ["--data_dir", a.data_dir, "--out_dir", out]
        rest += flags
    else:
        script = PEERS if kind == "peer" else PLAIN
        rest = [*flags, "--ds_config", setup.ds_file, "--data_dir", a.data_dir, *size]
        rest += ["--steps", a.steps, "--times", out / "times.json"]
        rest += ["--compile", a.plain_compile] if kind == "plain" else []
    return [str(x) for x in (script, *rest)]


def run_once(setup: Setup, row: str, out: Path) -> Measured:
    """One launch of `row`; its tokens/s after warm-up and its largest per-rank peak memory."""
    out.mkdir(parents=True)
    cmd = launch_command(setup, row, out)
    run = run_watched(setup.args.ranks, cmd, out / "log.txt", extra_env=ROW_ENV.get(row))
    if run.rc != 0:
        tail = (out / "log.txt").read_text()[-4000:]
        raise RowFailed(f"{row} failed (rc {run.rc}): {' '.join(run.cmd)}\n{tail}")
    times, gpu_peak, note = step_times(ROWS[row][0], out)
    warm = setup.args.warmup
    if len(times) != setup.args.steps:
        raise RowFailed(f"{row}: {len(times)} step times for {setup.args.steps} steps ({out})")
    seconds = times[-1] - times[warm - 1]
    tps = (len(times) - warm) * setup.tokens_per_step / seconds
    peak = gpu_peak if gpu_peak is not None else run.peak_bytes / 2**30
    return Measured(tps, peak, note)


def step_times(kind: str, out: Path) -> tuple[list[float], float | None, str]:
    """(wall-clock time at the end of each step, the GPU allocator's peak GiB or None, the
    launch's note on how it ran or "")."""
    if kind == "gpt_ds":
        train = [r for r in read_metrics(out) if "tokens_per_sec" in r]
        gpu = max(r["peak_mem_gib"] for r in train) if torch.cuda.is_available() else None
        return [r["time"] for r in train], gpu, ""
    data = json.loads((out / "times.json").read_text())
    return data["times"], data.get("peak_gpu_gib"), data.get("note", "")


def measure(
    setup: Setup, reps: int, on_result: Callable[[str, int, Measured], None] | None = None
) -> dict[str, list[Measured]]:
    """Every row `reps` times, interleaved: rep r starts at row r (rotation); `on_result(row,
    rep, measured)` as each one is measured (a run cut short keeps what it measured)."""
    rows = setup.args.rows
    results: dict[str, list[Measured]] = {r: [] for r in rows}
    for rep, row in interleaved(rows, reps):
        out = setup.work / f"{setup.model}_z{setup.stage}_{rep}_{row.replace(' ', '_')}"
        try:
            m = run_once(setup, row, out)
        except RowFailed as exc:  # the other rows still run: one table, the failure named
            print(f"  {setup.model} ZeRO-{setup.stage} rep {rep + 1}: {exc}", flush=True)
            continue
        results[row].append(m)
        if on_result is not None:
            on_result(row, rep, m)
        print(
            f"  {setup.model} ZeRO-{setup.stage} rep {rep + 1}: {row:<31} "
            f"{m.tokens_per_sec:9,.0f} tok/s  peak {m.peak_gib:.2f} GiB",
            flush=True,
        )
    return results


def add_launch_options(
    p: argparse.ArgumentParser, *, block_size: int, micro_batch_size: int, grad_accum: int,
    steps: int, warmup: int, reps: int,
) -> None:  # fmt: skip
    """The flags `measure` reads from Setup.args, at a benchmark's own defaults."""
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
