"""Data preparation throughput: `tools/prepare_data.py` (streaming, one encoding process per
CPU) against one tiktoken `encode_ordinary` call on one core, over the same text, in one run.

    python benchmarks/prepare.py                  # ~67 MB: Tiny Shakespeare x 60
    python benchmarks/prepare.py --mb 200 --reps 3

Rows, each a fresh process timed from start to exit (interpreter, imports, tokenizer, reading,
encoding, writing uint16 tokens):
- gpt_ds: `tools/prepare_data.py --input FILE --out_dir DIR --quiet`, its defaults;
- tiktoken, one core: read the whole file, one `encode_ordinary` call (one thread), the list
  as a uint16 array to a file; the same GPT-2 encoding (gpt_ds.data.tokenizer builds tiktoken's
  `gpt2` from the packaged files, offline).
Repetitions are interleaved (rotated order) and the median is reported. Peak RSS: the sum over
the process and its children (gpt_ds's workers) of each one's VmHWM, polled; pages the workers
share with their parent count once per process, so it is an upper bound for gpt_ds.

Same tokens: gpt_ds's train.bin + val.bin are compared with the one-shot encoding. They are
identical when the val split (at character int(n * 0.9), as nanoGPT does) falls on a token
boundary, as it does for a whole number of tens of copies; otherwise the tokens differ only at
that cut (train and val are encoded separately), which the check reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

import numpy as np  # noqa: E402
import psutil  # noqa: E402
from support.peak_rss import status_bytes  # noqa: E402
from support.workspace import work_dir  # noqa: E402

from gpt_ds.data.tokenizer import DEFAULT_CORPUS  # noqa: E402

TOOL = REPO / "tools" / "prepare_data.py"
GPT_DS = "gpt_ds (tools/prepare_data.py)"
TIKTOKEN = "tiktoken encode_ordinary, one core"
ROWS = (GPT_DS, TIKTOKEN)
REFERENCE = TIKTOKEN


@dataclass
class Measured:
    tokens: int
    seconds: float
    peak_bytes: int

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / self.seconds


def make_input(work: Path, mb: float) -> Path:
    """Tiny Shakespeare repeated to about `mb` MB (a whole number of copies, at least one)."""
    corpus = DEFAULT_CORPUS.read_bytes()
    copies = max(1, round(mb * 1e6 / len(corpus)))
    path = work / f"shakespeare_x{copies}.txt"
    if not path.exists() or path.stat().st_size != copies * len(corpus):
        path.write_bytes(corpus * copies)
    return path


def _tree_hwm(proc: psutil.Process, peaks: dict[int, int]) -> None:
    """Record the VmHWM (peak resident set) of `proc` and of each of its live children."""
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        peaks[p.pid] = max(peaks.get(p.pid, 0), status_bytes(p.pid, "VmHWM"))


def timed(cmd: list[str], log: Path) -> tuple[float, int]:
    """Run `cmd`; (wall-clock seconds from start to exit, the summed peak RSS of its tree)."""
    peaks: dict[int, int] = {}
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        handle = psutil.Process(proc.pid)
        while proc.poll() is None:
            _tree_hwm(handle, peaks)
            time.sleep(0.02)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed (rc {proc.returncode}): {' '.join(cmd)}\n{log.read_text()}")
    return seconds, sum(peaks.values())


def run_gpt_ds(text: Path, out: Path) -> Measured:
    cmd = [sys.executable, str(TOOL), "--input", str(text), "--out_dir", str(out), "--quiet"]
    seconds, peak = timed(cmd, out.with_suffix(".log"))
    meta = json.loads((out / "meta.json").read_text())
    return Measured(meta["train_tokens"] + meta["val_tokens"], seconds, peak)


def run_tiktoken(text: Path, out: Path) -> Measured:
    cmd = [sys.executable, __file__, "--one_core", str(text), str(out)]
    seconds, peak = timed(cmd, out.with_suffix(".log"))
    return Measured(out.stat().st_size // 2, seconds, peak)


def one_core(text: Path, out: Path) -> None:
    """The baseline, in its own process: one `encode_ordinary` call over the whole text."""
    from gpt_ds.data.tokenizer import get_encoding

    enc = get_encoding()
    with open(text, encoding="utf-8-sig") as f:  # text mode: "\n" line ends, as gpt_ds reads
        data = f.read()
    np.array(enc.encode_ordinary(data), dtype=np.uint16).tofile(out)


def measure(text: Path, work: Path, reps: int) -> dict[str, list[Measured]]:
    """Every row `reps` times, interleaved: rep r starts at row r (rotation)."""
    results: dict[str, list[Measured]] = {r: [] for r in ROWS}
    for rep in range(reps):
        for row in ROWS[rep % len(ROWS) :] + ROWS[: rep % len(ROWS)]:
            if row == GPT_DS:
                m = run_gpt_ds(text, work / f"gpt_ds_{rep}")
            else:
                m = run_tiktoken(text, work / f"tiktoken_{rep}.bin")
            results[row].append(m)
            print(
                f"  rep {rep + 1}: {row:<36} {m.tokens_per_sec:12,.0f} tok/s  "
                f"{m.seconds:7.2f} s  peak {m.peak_bytes / 2**20:,.0f} MiB",
                flush=True,
            )
    return results


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def compare_tokens(work: Path) -> str:
    """Whether gpt_ds's train.bin + val.bin equal the one-shot encoding; where they differ."""
    ours = np.concatenate(
        [np.fromfile(work / "gpt_ds_0" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")]
    )
    ref = np.fromfile(work / "tiktoken_0.bin", dtype=np.uint16)
    if np.array_equal(ours, ref):
        return f"same tokens: yes, identical token streams ({len(ref):,} tokens)"
    head = _common_prefix(ours, ref)
    tail = _common_prefix(ours[::-1], ref[::-1])
    n_train = (work / "gpt_ds_0" / "train.bin").stat().st_size // 2
    return (
        f"same tokens: no, gpt_ds {len(ours):,} vs tiktoken {len(ref):,}; they differ in "
        f"tokens [{head:,}, {len(ours) - tail:,}) of gpt_ds (train.bin ends at {n_train:,}: "
        "train and val are encoded separately, so a word the val split cuts differs)"
    )


def table(results: dict[str, list[Measured]]) -> str:
    """Markdown: median tokens/s, seconds and peak RSS per row; tokens/s over one core's."""
    med = {
        r: (
            statistics.median(m.tokens_per_sec for m in ms),
            statistics.median(m.seconds for m in ms),
            statistics.median(m.peak_bytes for m in ms),
        )
        for r, ms in results.items()
    }
    ref_tps = med[REFERENCE][0]
    lines = [
        "| preparation | tokens | tokens/s (median) | each repetition | seconds | peak RSS "
        "| × one core |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for row, ms in results.items():
        tps, seconds, peak = med[row]
        reps = " / ".join(f"{m.tokens_per_sec:,.0f}" for m in ms)
        lines.append(
            f"| {row} | {ms[0].tokens:,} | {tps:,.0f} | {reps} | {seconds:.2f} | "
            f"{peak / 2**20:,.0f} MiB | {tps / ref_tps:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=67.0, help="input size: Tiny Shakespeare copies")
    p.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    p.add_argument("--work_dir", help="keep the input, the outputs and the logs here")
    p.add_argument("--one_core", nargs=2, metavar=("TEXT", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.mb <= 0 or a.reps < 1:
        p.error("--mb must be > 0 and --reps >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one_core:
        one_core(*map(Path, args.one_core))
        return 0
    with work_dir(args.work_dir, "gpt_ds_prepare_") as work:
        text = make_input(work, args.mb)
        results = measure(text, work, args.reps)
        print(
            f"\n{text.name}: {text.stat().st_size / 1e6:.1f} MB, {psutil.cpu_count()} CPUs, "
            f"median of {args.reps} interleaved repetitions; {compare_tokens(work)}\n"
        )
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
