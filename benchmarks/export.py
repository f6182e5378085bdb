"""Export time and peak memory: gpt_ds's tools/zero_to_fp32.py against DeepSpeed's own
zero_to_fp32.py script, on the same ZeRO-2 checkpoint of a real gpt_ds training run, in one run.

    python benchmarks/export.py                              # gpt2-medium, 3 repetitions
    python benchmarks/export.py --model gpt2-tiny --reps 1
    python benchmarks/export.py --checkpoint out/ --reps 5   # an existing run's out dir

The checkpoint: `deepspeed --num_gpus 2 gpt_ds/train.py --deepspeed_config zero2` for one fp32
iteration (block 64, micro-batch 1), unless --checkpoint names one. Rows, each a separate
process on the tag `latest` names:
- gpt_ds: `tools/zero_to_fp32.py OUT --tag TAG --output DIR`, a Hugging Face directory (config,
  tokenizer, model.safetensors), every checkpoint file's checksum verified first;
- DeepSpeed: `python zero_to_fp32.py OUT DIR --tag TAG`, a copy of the installed
  deepspeed/utils/zero_to_fp32.py (as DeepSpeed copies it into every run directory), writing
  pytorch_model.bin (its --safe_serialization cannot write GPT-2: it refuses the tied
  lm_head/wte pair).
Repetitions are interleaved (every row once, then again in a rotated order) and the median is
reported. Between runs, untimed, the output is deleted and dirty pages are flushed (`sync`).
Time: the process's wall clock, start to exit (interpreter and imports included). Peak RSS:
the kernel's (wait4's ru_maxrss). Peak anonymous memory: RssAnon of /proc/PID/status, polled
every 5 ms: what the process allocated itself, where RSS also counts the memory-mapped
checkpoint pages (page cache). One fp32 copy: the model's parameters x 4 bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

from support.launch import launch_env, run_deepspeed  # noqa: E402
from support.peak_rss import status_bytes  # noqa: E402
from support.workspace import prepare_shakespeare, work_dir  # noqa: E402

from gpt_ds.checkpoint.manifest import Manifest  # noqa: E402
from gpt_ds.checkpoint.tags import latest_tag  # noqa: E402
from gpt_ds.model.gpt2 import MODEL_PRESETS, unpadded  # noqa: E402

GPT_DS = "gpt_ds tools/zero_to_fp32.py"
DEEPSPEED = "DeepSpeed zero_to_fp32.py"
ROWS = [GPT_DS, DEEPSPEED]
WEIGHTS = {GPT_DS: "model.safetensors", DEEPSPEED: "pytorch_model.bin"}


@dataclass
class Measured:
    seconds: float
    peak_rss: int  # bytes
    peak_anon: int  # bytes


def deepspeed_script(work: Path) -> Path:
    """A copy of the installed DeepSpeed's zero_to_fp32.py, as DeepSpeed copies it into each run
    directory: run where it is installed, its folder's `torch.py` would shadow torch."""
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("deepspeed is not installed in this environment")
    installed = Path(next(iter(spec.submodule_search_locations))) / "utils" / "zero_to_fp32.py"
    return Path(shutil.copy(installed, work / "zero_to_fp32.py"))


def command(row: str, out_dir: Path, tag: str, dest: Path, script: Path) -> list[str]:
    if row == GPT_DS:
        tool = REPO / "tools" / "zero_to_fp32.py"
        args = [tool, out_dir, "--tag", tag, "--output", dest, "--quiet"]
    else:
        args = [script, out_dir, dest, "--tag", tag]
    return [sys.executable, *map(str, args)]


def run_once(cmd: list[str], log: Path) -> Measured:
    """Run `cmd` to its end: wall seconds, peak RSS (exact, from wait4), peak RssAnon (polled)."""
    with log.open("w") as f:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=launch_env(), stdout=f, stderr=subprocess.STDOUT)
        anon = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            anon = max(anon, status_bytes(proc.pid, "RssAnon"))
            time.sleep(0.005)
        seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(
            f"failed (rc {proc.returncode}): {' '.join(cmd)}\n{log.read_text()[-4000:]}"
        )
    return Measured(seconds, usage.ru_maxrss * 1024, anon)


def measure(out_dir: Path, tag: str, work: Path, reps: int) -> dict[str, list[Measured]]:
    """Every row `reps` times, interleaved: rep r starts at row r (rotation)."""
    results: dict[str, list[Measured]] = {r: [] for r in ROWS}
    script = deepspeed_script(work)
    for rep in range(reps):
        for row in ROWS[rep % len(ROWS) :] + ROWS[: rep % len(ROWS)]:
            dest = work / f"export_{rep}_{ROWS.index(row)}"
            log = work / f"export_{rep}_{ROWS.index(row)}.log"
            results[row].append(m := run_once(command(row, out_dir, tag, dest, script), log))
            if not (dest / WEIGHTS[row]).is_file():
                raise SystemExit(f"{row} wrote no {WEIGHTS[row]} in {dest} (log: {log})")
            shutil.rmtree(dest)
            os.sync()  # the next run does not pay for this one's writeback
            print(
                f"  rep {rep + 1}: {row:<48} {m.seconds:6.2f} s  peak RSS "
                f"{m.peak_rss / 2**30:.2f} GiB, anon {m.peak_anon / 2**30:.2f} GiB",
                flush=True,
            )
    return results


def table(results: dict[str, list[Measured]], fp32_bytes: int) -> str:
    """Markdown: median seconds, each repetition, peak memory, ratios."""
    med = {
        row: [statistics.median(getattr(m, k) for m in ms) for k in Measured.__annotations__]
        for row, ms in results.items()
    }
    ref_seconds = med[DEEPSPEED][0]
    lines = [
        "| tool | seconds (median) | each repetition | peak RSS | peak anon "
        "| × one fp32 copy (RSS / anon) | × DeepSpeed's time |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for row, ms in results.items():
        seconds, rss, anon = med[row]
        reps = " / ".join(f"{m.seconds:.2f}" for m in ms)
        lines.append(
            f"| {row} | {seconds:.2f} | {reps} | {rss / 2**30:.2f} GiB | {anon / 2**30:.2f} GiB "
            f"| {rss / fp32_bytes:.2f} / {anon / fp32_bytes:.2f} | {seconds / ref_seconds:.2f} |"
        )
    return "\n".join(lines)


def train(args: argparse.Namespace, work: Path) -> Path:
    """A real gpt_ds ZeRO-2 run of one fp32 iteration; its out dir (with `latest` and a tag)."""
    data = args.data_dir or prepare_shakespeare(work)
    out = work / f"{args.model}_zero2"
    flags = {"deepspeed_config": "zero2", "model": args.model, "block_size": args.block_size}
    flags |= {"micro_batch_size": 1, "grad_accum": 1, "max_iters": 1, "eval_interval": 0}
    flags |= {"eval_iters": 1, "precision": "fp32", "data_dir": data, "out_dir": out}
    argv = [str(x) for k, v in flags.items() for x in (f"--{k}", v)]
    print(f"training {args.model} for one iteration (ZeRO-2, 2 ranks, fp32) -> {out}", flush=True)
    run_deepspeed(argv, num_gpus=2, timeout=3600)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-medium", choices=list(MODEL_PRESETS))
    p.add_argument("--block_size", type=int, default=64, help="of the training run")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    p.add_argument("--checkpoint", help="an existing training out dir (its `latest` tag)")
    p.add_argument("--data_dir", help="a prepared data dir (default: Tiny Shakespeare)")
    p.add_argument("--work_dir", help="keep the training run, logs and outputs here")
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error("--reps must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with work_dir(args.work_dir, "gpt_ds_export_bench_") as work:
        out_dir = Path(args.checkpoint) if args.checkpoint else train(args, work)
        tag = latest_tag(out_dir)
        manifest = Manifest.read(out_dir / str(tag)) if tag else None
        if manifest is None:
            raise SystemExit(f"{out_dir}: no `latest` naming a complete checkpoint")
        shape = manifest.shape
        n = unpadded(shape).num_params()  # the exported model: GPT-2's rows, no padding
        on_disk = sum(manifest.files.values())
        results = measure(out_dir, tag, work, args.reps)
        print(
            f"\n{out_dir}/{tag}: GPT-2 {shape.n_layer} layers x {shape.n_embd} wide, "
            f"{n:,} parameters, one fp32 copy {n * 4 / 2**30:.2f} GiB; ZeRO-{manifest.zero_stage}, "
            f"{manifest.world_size} ranks, trained in {manifest.precision}, "
            f"{on_disk / 2**30:.2f} GiB on disk; {os.cpu_count()} CPUs; "
            f"median of {args.reps} interleaved repetitions\n"
        )
        print(table(results, n * 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
