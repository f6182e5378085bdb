"""The LM loss alone, forward and backward, on one thread, each `--loss` kind: the full logits
(GPT2LMHeadModel's path: logits, upcast to fp32, torch's cross-entropy; `--loss full`),
DeepSpeed's chunked cross-entropy over the logits (`--loss deepspeed`, its PyTorch backend on
CPU), and gpt_ds's chunked loss, with its logit gradients gathered per block (the default) and
with one gradient product per chunk (how it ran before blocks, and how it runs on GPUs).

    python benchmarks/chunked_loss.py                       # gpt2-tiny and gpt2-mini widths
    python benchmarks/chunked_loss.py --widths 768 --tokens 1024 --dtypes bfloat16

Each row: the median wall time of `--reps` timed calls after one untimed one, of the loss and
its backward for `--tokens` hidden states of a width against GPT-2's padded head (50304 rows,
the real 50257 predicted); the passes it and its backward make over the logits and the
operators that touch them (support/logit_traffic.py: what sets a GPU's time for the loss, which
runs at memory speed there); and the relative error of both gradients against the full logits
path in fp64 (the reference). One thread, as each of the throughput table's 2 ranks has one
core: the ratios are what a rank sees, not the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's gpt_ds

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from support.logit_traffic import logit_traffic  # noqa: E402

from gpt_ds.model.training_model import (  # noqa: E402
    chunk_rows,
    chunked_cross_entropy,
    deepspeed_cross_entropy,
)

VOCAB, PADDED = 50257, 50304


def full_logits(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """GPT2LMHeadModel's loss: the whole logits, upcast, cross-entropy (padding never a
    target, as in the trainer's full path it gets -inf)."""
    logits = (hidden @ weight.t()).float()
    logits[:, VOCAB:] = float("-inf")
    return F.cross_entropy(logits, labels)


def rows_for() -> dict[str, Callable]:
    """Row name -> loss function of (hidden, weight, labels)."""
    rows = chunk_rows(PADDED, "cpu")
    return {
        "full logits (HF)": full_logits,
        "DeepSpeed's chunked cross-entropy": lambda h, w, y: deepspeed_cross_entropy(
            h @ w.t(), y, VOCAB
        ),
        "chunked, one product per chunk": lambda h, w, y: chunked_cross_entropy(
            h, w, y, rows, VOCAB, block=rows
        ),
        "chunked (default)": lambda h, w, y: chunked_cross_entropy(h, w, y, tokens=VOCAB),
    }


def inputs(tokens: int, width: int, dtype: torch.dtype, seed: int = 0):
    """(hidden, weight, labels): GPT-2-sized init, leaves that take gradients."""
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(PADDED, width, generator=g) * 0.02).to(dtype).requires_grad_()
    hidden = torch.randn(tokens, width, generator=g).to(dtype).requires_grad_()
    return hidden, weight, torch.randint(0, VOCAB, (tokens,), generator=g)


def gradients(fn: Callable, hidden, weight, labels) -> tuple[torch.Tensor, torch.Tensor]:
    hidden.grad = weight.grad = None
    fn(hidden, weight, labels).backward()
    return hidden.grad.double(), weight.grad.double()


def timed(fn: Callable, hidden, weight, labels, reps: int) -> float:
    """Median seconds of loss + backward, after one untimed call."""
    gradients(fn, hidden, weight, labels)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        gradients(fn, hidden, weight, labels)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def table(tokens: int, width: int, dtype: torch.dtype, reps: int) -> str:
    hidden, weight, labels = inputs(tokens, width, dtype)
    ref = [t.detach().double().requires_grad_() for t in (hidden, weight)]
    want = gradients(full_logits, *ref, labels)
    lines = [
        f"**{tokens} tokens x width {width}, {str(dtype).removeprefix('torch.')}**",
        "",
        "| loss | ms (median) | × full logits | logit passes | launches on logits "
        "| hidden grad error | weight grad error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = None
    for name, fn in rows_for().items():
        seconds = timed(fn, hidden, weight, labels, reps)
        base = base or seconds
        traffic = logit_traffic(fn, hidden, weight, labels, VOCAB)
        gh, gw = gradients(fn, hidden, weight, labels)
        lines.append(
            f"| {name} | {seconds * 1e3:,.1f} | {base / seconds:.2f} | {traffic.passes:.1f} | "
            f"{traffic.launches} | {rel_err(gh, want[0]):.1e} | {rel_err(gw, want[1]):.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=512, help="per micro-batch (default: 4 x 128)")
    p.add_argument("--widths", type=int, nargs="+", default=[128, 384])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                   choices=["bfloat16", "float32"])  # fmt: skip
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tables = [
        table(args.tokens, width, getattr(torch, dtype), args.reps)
        for dtype in args.dtypes
        for width in args.widths
    ]
    print(f"\none thread, {args.reps} timed calls each, errors against fp64 full logits")
    print("logit passes: bytes the loss and its backward stream over logits-shaped tensors, in")
    print("passes over the fp32 logits (support/logit_traffic.py); launches: operators on them\n")
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
