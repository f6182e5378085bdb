"""One command for a GPU machine: what gpt_ds runs on there, how fast it trains against
nanoGPT's recipe, and whether its GPU tests pass, written into a folder as each figure exists.

    python benchmarks/gpu_check.py --out gpu_check/ --budget 480   # one short GPU slot

Steps, in this order, each a process of its own with a time limit, its output in OUT/logs/,
planned to end inside `--budget` seconds (a step that no longer fits is skipped, said):
- the environment: GPUs, driver, CUDA/ROCm, versions (read without importing DeepSpeed, so
  it is written even where DeepSpeed is missing), nvcc, and the precision and Adam(W) a run
  would pick here, with the reasons the trainer prints; written at once;
- throughput on one GPU (benchmarks/throughput.py): GPT-2 124M at block 1024 in bf16 (fp16 where
  bf16 is absent), micro-batch 16 as every earlier table (`--micro_batch_size 0`: the largest
  power of two that fills the card), in this order: gpt_ds with its defaults (the chunked loss),
  the same with each loss chunk's body compiled (GPT_DS_LOSS_FUSED=1), the anchor, plain PyTorch
  by nanoGPT's recipe (compiled, bf16 autocast, fused AdamW), one row per other loss kind
  (`--loss full`, `--loss deepspeed`), `--compile off` and gpt_ds without ZeRO (DeepSpeed stage
  0); every repetition written to OUT/throughput.jsonl and .md as it is measured;
- a profile of gpt_ds's defaults at the same size (`--profile`, steps 3-5, no log line among
  them): the trainer's kernel launches and host syncs by phase, into the report;
- `pytest -m gpu`, the suite's GPU subset: its summary line;
- the README's quick start (launchers/quickstart.sh) on one GPU: train, export, sample;
- gpt2-xl under ZeRO-3 on that GPU, only where the budget leaves room: start-up and three
  steps, the trainer's own predicted and measured memory lines and its step times.
OUT/gpu_check.md and OUT/gpu_check.json are rewritten after every step, so a slot that ends
early keeps what was measured. Without a GPU it writes the environment, says so and exits 0;
`--on_cpu` runs the steps on CPU ranks anyway, at the sizes given (the script's own test).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

from support.launch import (  # noqa: E402
    TRAIN,
    deepspeed_launch,
    free_port,
    launch_env,
    planned,
)
from support.workspace import prepare_shakespeare  # noqa: E402

THROUGHPUT_ROWS = [  # measured in this order, so a step cut short keeps the first ones
    "gpt_ds",  # compiled: --compile auto compiles on GPUs; the chunked loss
    "gpt_ds fused loss chunks",  # each chunk's body compiled too (GPT_DS_LOSS_FUSED=1)
    "plain PyTorch (nanoGPT recipe)",  # the anchor, third: the ratio survives a short slot
    "gpt_ds --loss full",  # the fp32 logits' loss inside the compiled graph, as nanoGPT
    "gpt_ds --loss deepspeed",  # DeepSpeed's chunked cross-entropy (Triton) over the logits
    "gpt_ds --compile off",
    # DeepSpeed's FP16_UnfusedOptimizer under torch's AdamW: 0.47x ZeRO-2 on an H200
    "gpt_ds without ZeRO (stage 0)",
]
# each step's longest time (seconds), in the order they run; --limit STEP=SECONDS changes one
STEP_LIMIT_S = {
    "throughput": 300,
    "profile": 120,
    "gpu tests": 180,
    "quick start": 120,
    "gpt2-xl zero3": 150,
}
MIN_STEP_S = 30  # a step with less of the budget left is skipped


def version(package: str) -> str | None:
    """An installed package's version, read from its metadata (nothing imported)."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def optimizer_choice() -> str:
    """The Adam(W) a run would build here, as the trainer says it; what is missing, if the
    choice cannot be made (it asks DeepSpeed's op builders)."""
    from gpt_ds.dsconfig.optimization import choose_adam
    from gpt_ds.launch.machine import adam_facts

    try:
        return choose_adam(adam_facts(offload=False), {}).note
    except ImportError as exc:  # DeepSpeed missing: the rest of the environment still counts
        return f"unknown (DeepSpeed not importable: {exc})"


def environment() -> dict:
    """What decides how gpt_ds runs here, as the trainer itself decides it."""
    import torch

    from gpt_ds.launch.gpu_support import GpuFacts, gather_facts, gpu_problems
    from gpt_ds.launch.machine import detect_precision, nvcc_version

    facts = GpuFacts.from_probe(gather_facts())
    precision, why = detect_precision()
    nvcc = shutil.which("nvcc")
    return {
        "gpus": [f"{d.name} ({d.arch})" for d in facts.devices],
        "driver": facts.driver,
        "cuda": facts.cuda,
        "rocm": facts.hip,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "deepspeed": version("deepspeed"),
        "transformers": version("transformers"),
        "nvcc": f"{nvcc} ({nvcc_version(Path(nvcc))})" if nvcc else None,
        "precision": f"{precision}: {why}",
        "optimizer": optimizer_choice(),
        "problems": gpu_problems(facts),
        "usable_gpu": facts.cuda_available and bool(facts.devices),
    }


def run_step(name: str, cmd: list[str], out: Path, limit_s: float) -> dict:
    """Run one step as a process group (its ranks too, stopped together at the limit); its
    output to OUT/logs/NAME.log, its text returned."""
    log = out / "logs" / f"{name.replace(' ', '_')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=launch_env(), stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
            sink.write(f"\n(stopped after {limit_s:.0f} s)\n")
    seconds = time.perf_counter() - start
    print(f"{name}: rc {rc} in {seconds:.0f} s (log: {log})", flush=True)
    text = log.read_text(errors="replace")
    return {"rc": rc, "seconds": round(seconds, 1), "log": str(log), "text": text}


class Budget:
    """The seconds left of `--budget`: each step's time limit is its own longest, cut to what
    is left; a step with less than MIN_STEP_S left does not start."""

    def __init__(self, seconds: float):
        self.ends = time.monotonic() + seconds

    def left(self) -> float:
        return self.ends - time.monotonic()

    def limit(self, longest: float) -> float | None:
        left = self.left()
        return None if left < MIN_STEP_S else min(longest, left)


def step_commands(args: argparse.Namespace, env: dict, out: Path, work: Path) -> dict:
    """The steps after the environment, in order: name -> command (data prepared in `work`)."""
    python, data = sys.executable, args.data_dir or prepare_shakespeare(work / "data")
    precision = "bf16" if env["precision"].startswith("bf16") else "fp16"
    if args.on_cpu:
        precision = "fp32"
    micro = args.micro_batch_size or card_filling_micro_batch(
        torch_cuda_bytes(), lambda m: predicted_full_logits_peak(m, precision, data)
    )
    print(f"throughput and profile micro-batch: {micro}", flush=True)
    commands = {
        "throughput": throughput_command(args, python, data, precision, micro, work, out),
        "profile": profile_command(args, data, precision, micro, work / "profile"),
        "gpu tests": [python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"],
        "quick start": quickstart_command(python, data, work / "quickstart", args.on_cpu),
        "gpt2-xl zero3": xl_command(data, work / "gpt2-xl"),
    }
    return {name: cmd for name, cmd in commands.items() if name not in args.skip}


def run_steps(args: argparse.Namespace, budget: Budget, env: dict, out: Path, work: Path) -> dict:
    """Each step in turn while the budget lasts; the report rewritten after every one."""
    results: dict = {}
    for name, cmd in step_commands(args, env, out, work).items():
        limit = budget.limit(args.limits[name])
        if limit is None:
            print(f"{name}: skipped, {budget.left():.0f} s of --budget left", flush=True)
            results[name] = {"rc": None, "seconds": 0, "log": "-", "text": "skipped: no budget"}
        else:
            results[name] = run_step(name, cmd, out, limit)
        if name == "gpu tests":
            results[name]["summary"] = results[name]["text"].strip().splitlines()[-1:]
        write_report(out, env, results)
    return results


def quickstart_command(python: str, data: Path, out_dir: Path, on_cpu: bool) -> list[str]:
    """The README's quick start (launchers/quickstart.sh: train, export, sample) on one GPU,
    with this interpreter and the prepared data; on CPU ranks (this script's test) 4 steps."""
    settings = [f"GPT_DS_PYTHON={python}", f"GPT_DS_DATA={data}", f"GPT_DS_OUT={out_dir}"]
    settings.append(f"MASTER_PORT={free_port()}")  # not 29500: another launch may hold it
    cmd = ["env", *settings, "GPT_DS_NUM_GPUS=1", "bash", str(REPO / "launchers" / "quickstart.sh")]
    tiny = ["--max_iters", "4", "--warmup_iters", "1", "--eval_interval", "2", "--eval_iters", "1"]
    return cmd + (tiny if on_cpu else [])


def xl_command(data: Path, out_dir: Path) -> list[str]:
    """gpt2-xl under ZeRO-3 on one GPU: start-up and three steps, no eval, no checkpoint."""
    xl = ["--model", "gpt2-xl", "--deepspeed_config", "zero3", "--block_size", "1024"]
    xl += ["--micro_batch_size", "1", "--grad_accum", "1", "--max_iters", "3"]
    xl += ["--eval_interval", "0", "--no_checkpoint", "--log_interval", "1"]
    xl += ["--data_dir", str(data), "--out_dir", str(out_dir)]
    return deepspeed_launch(1, free_port(), TRAIN, xl, [])


def profile_command(
    args: argparse.Namespace, data: Path, precision: str, micro: int, out_dir: Path
) -> list[str]:
    """gpt_ds with its defaults at the throughput rows' size, `--profile`d: steps 3-5 after the
    compile, no log line among them; rank 0 prints kernel launches and host syncs by phase."""
    run = ["--model", args.model, "--block_size", str(args.block_size)]
    run += ["--micro_batch_size", str(micro), "--grad_accum", "1", "--precision", precision]
    run += ["--max_iters", "8", "--log_interval", "10", "--eval_interval", "0"]
    run += ["--no_checkpoint", "--profile", "--data_dir", str(data), "--out_dir", str(out_dir)]
    return deepspeed_launch(1, free_port(), TRAIN, run, [])  # a free port: not alone on a box


def throughput_command(
    args: argparse.Namespace,
    python: str,
    data: Path,
    precision: str,
    micro: int,
    work: Path,
    out: Path,
) -> list[str]:
    """benchmarks/throughput.py on one GPU: args.model at args.block_size, every row of
    args.rows, each repetition written to OUT/throughput.jsonl (and .md) as it is measured."""
    cmd = [python, str(REPO / "benchmarks" / "throughput.py"), "--models", args.model]
    cmd += ["--stages", "2", "--ranks", "1", "--block_size", str(args.block_size)]
    cmd += ["--precision", precision, "--micro_batch_size", str(micro)]
    cmd += ["--grad_accum", "1", "--steps", str(args.steps), "--warmup", str(args.steps // 3)]
    cmd += ["--reps", str(args.reps), "--data_dir", str(data), "--rows", *args.rows]
    cmd += ["--results", str(out / "throughput.jsonl")]
    return cmd + ["--work_dir", str(work / "throughput")]


def report(env: dict, results: dict, out: Path) -> str:
    """The markdown: the environment table, then each step's outcome and its key lines (the
    throughput's: every repetition measured, from OUT/throughput.md)."""
    lines = ["# gpt_ds GPU check", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v if v not in (None, []) else '-'} |" for k, v in env.items()]
    if not env["usable_gpu"] and not results:
        lines += ["", "No GPU usable here: nothing else to run (exit 0)."]
    for name, res in results.items():
        if res["rc"] is None:
            lines += ["", f"## {name}: skipped, the --budget left too little time"]
            continue
        lines += ["", f"## {name}: rc {res['rc']} in {res['seconds']} s (log: {res['log']})", ""]
        measured = out / "throughput.md"
        if name == "throughput" and measured.is_file():
            lines += ["| model | row | repetition | tokens/s | peak |", "|---|---|---:|---:|---:|"]
            lines += [*measured.read_text().splitlines(), ""]
        if name == "profile":
            lines += profile_table(res["text"])
        lines += [ln for ln in res["text"].splitlines() if _key_line(ln)][-40:]
    return "\n".join(lines) + "\n"


def profile_table(text: str) -> list[str]:
    """The trainer's per-step table of a profiled run (kernel launches and host syncs by
    phase, the busiest operators, the syncs named), as a code block; none if it has none."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("per optimizer step")), None)
    if start is None:
        return []
    end = next(
        (i for i in range(start, len(lines)) if lines[i].startswith("host syncs:")), start + 12
    )
    return ["```", *lines[start : end + 1], "```", ""]


def _key_line(line: str) -> bool:
    """A table row, a summary, the lines on the plain loops, or the trainer's memory and step
    lines."""
    words = ("passed", "failed", "predicted", "peak memory", "iter ", "plain PyTorch")
    return line.startswith(("|", "**")) or any(w in line for w in words)


def write_report(out: Path, env: dict, results: dict) -> str:
    """OUT/gpu_check.md and OUT/gpu_check.json as they stand now (each replaced whole)."""
    text = report(env, results, out)
    (out / "gpu_check.md").write_text(text)
    slim = {k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in results.items()}
    (out / "gpu_check.json").write_text(json.dumps({"environment": env, **slim}, indent=1))
    return text


def card_filling_micro_batch(
    card_bytes: int, predicted: Callable[[int], int], share: float = 0.8, most: int = 64
) -> int:
    """The largest power-of-two micro-batch (up to `most`) whose predicted peak fits `share` of
    the card; 1 where none does."""
    best, micro = 1, 1
    while micro <= most and predicted(micro) <= share * card_bytes:
        best, micro = micro, micro * 2
    return best


def predicted_full_logits_peak(micro: int, precision: str, data: str) -> int:
    """The memory model's per-rank peak for the throughput table's gpt2 run with the full
    logits (`--loss full`, the table's hungriest row and about the HF Trainer's need)."""
    argv = ["--model", "gpt2", "--deepspeed_config", "zero2", "--block_size", "1024"]
    argv += ["--micro_batch_size", str(micro), "--grad_accum", "1", "--precision", precision]
    argv += ["--loss", "full", "--max_iters", "30", "--eval_interval", "0", "--no_checkpoint"]
    argv += ["--data_dir", data, "--out_dir", "unused", "--ignore_memory_estimate"]
    return planned(argv, ranks=1).estimate.total


def torch_cuda_bytes() -> int:
    import torch

    return torch.cuda.get_device_properties(0).total_memory


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for the results")
    p.add_argument(
        "--work_dir", type=Path, help="the runs' data and output (default: a temporary folder)"
    )
    p.add_argument(
        "--budget", type=float, default=480, help="seconds for every step together (default 480)"
    )
    p.add_argument(
        "--micro_batch_size",
        type=int,
        default=16,
        help="throughput rows' micro-batch (default 16, as every earlier table); 0: the largest "
        "power of two whose predicted peak with the full logits fills 80%% of the card",
    )
    p.add_argument(
        "--data_dir", type=Path, help="prepared data (default: Tiny Shakespeare, in the work dir)"
    )
    p.add_argument("--model", default="gpt2", help="throughput's model preset (default gpt2)")
    p.add_argument("--block_size", type=int, default=1024, help="throughput's block size")
    p.add_argument(
        "--on_cpu",
        action="store_true",
        help="run the steps on CPU ranks (fp32) though no GPU is usable: this script's test",
    )
    p.add_argument("--steps", type=int, default=30, help="throughput steps a launch (1/3 warm-up)")
    p.add_argument("--reps", type=int, default=2, help="throughput's interleaved repetitions")
    p.add_argument("--rows", nargs="+", default=THROUGHPUT_ROWS, metavar="ROW",
                   help="throughput rows (default: %(default)s)")  # fmt: skip
    p.add_argument("--skip", nargs="+", default=[], choices=list(STEP_LIMIT_S), metavar="STEP",
                   help=f"steps not to run: {', '.join(map(repr, STEP_LIMIT_S))}")  # fmt: skip
    p.add_argument("--limit", action="append", default=[], metavar="STEP=SECONDS",
                   help=f"a step's time limit (default: {STEP_LIMIT_S})")  # fmt: skip
    args = p.parse_args(argv)
    args.limits = dict(STEP_LIMIT_S)
    for item in args.limit:
        name, _, seconds = item.rpartition("=")
        if name not in STEP_LIMIT_S or not seconds.isdigit():
            p.error(f"--limit {item}: expected STEP=SECONDS with STEP one of {list(STEP_LIMIT_S)}")
        args.limits[name] = int(seconds)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget = Budget(args.budget)  # from the start: the environment and the data count too
    # every step and tool it launches imports this checkout's gpt_ds, installed or not
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.getenv("PYTHONPATH")]))
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env, indent=1), flush=True)
    results: dict = {}
    write_report(args.out, env, results)  # the environment, before anything can go wrong
    if env["usable_gpu"] or args.on_cpu:
        with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
            work = args.work_dir or Path(scratch)
            results = run_steps(args, budget, env, args.out, work)
    print(write_report(args.out, env, results))
    return 0 if all(r["rc"] in (0, None) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
