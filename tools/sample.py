"""Generate text from a trained GPT-2: an exported Hugging Face directory or a training checkpoint.

    python tools/sample.py --model export/ --prompt "ROMEO:"
    python tools/sample.py --model out/ --tag iter_200 --prompt "ROMEO:" --num_samples 3
    python tools/sample.py --model out/ --prompt "ROMEO:" --temperature 0     # greedy

A training out dir (or a tag directory in it) is consolidated in memory with the export code
(tools/zero_to_fp32.py), no conversion step needed. Samples go to stdout, each followed by a
separator line; progress and notes go to stderr.
"""

from __future__ import annotations

import argparse
import sys

from gpt_ds.errors import GptDsError

SEPARATOR = "-" * 40


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--model", required=True, help="exported HF directory, training out dir or tag dir"
    )
    p.add_argument("--tag", default=None, help="checkpoint tag (default: the one `latest` names)")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    p.add_argument("--max_new_tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy decoding")
    p.add_argument("--top_k", type=int, default=200, help="sample from the k likeliest (0: all)")
    p.add_argument("--num_samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if any)")
    args = p.parse_args(argv)
    problems = [
        f"--{name} must be > 0, got {getattr(args, name)}"
        for name in ("max_new_tokens", "num_samples")
        if getattr(args, name) < 1
    ]
    if args.temperature < 0 or args.top_k < 0:
        problems.append("--temperature and --top_k must be >= 0")
    if problems:
        p.error("; ".join(problems))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from gpt_ds.sampling import generate, load_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        loaded = load_model(args.model, args.tag, device)
        print(f"loaded {loaded.source}", file=sys.stderr)
        samples = generate(
            loaded.model,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            num_samples=args.num_samples,
            seed=args.seed,
        )
    except GptDsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for text in samples:
        print(text)
        print(SEPARATOR, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
