"""Generate text from a trained GPT-2: an exported Hugging Face directory or a training checkpoint.

    gpt-ds-sample --model export/ --prompt "ROMEO:"
    gpt-ds-sample --model out/ --tag iter_200 --prompt "ROMEO:" --num_samples 3
    gpt-ds-sample --model out/ --prompt "ROMEO:" --temperature 0     # greedy

(`python tools/sample.py ...` in a checkout is the same command.) A training out dir (or a tag
directory in it) is consolidated in memory with the export code (gpt-ds-export's), no
conversion step needed. Samples go to stdout, each followed by a separator line; progress and
notes go to stderr.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from gpt_ds.base.cli import option, parse, run_tool
from gpt_ds.base.errors import ConfigError
from gpt_ds.checkpoint.integrity import ALLOW_HELP

SEPARATOR = "-" * 40


@dataclass
class SampleOptions:
    model: str = option(help="exported HF directory, training out dir or tag dir")
    tag: str | None = option(None, "checkpoint tag (default: the one `latest` names)")
    prompt: str = option("", "text to continue (default: start of a document)")
    max_new_tokens: int = option(100, "tokens to generate (cut to the model's context)")
    temperature: float = option(0.8, "0 = greedy decoding")
    top_k: int = option(200, "sample from the k likeliest (0: all)")
    num_samples: int = option(1, "how many continuations")
    seed: int = option(1337, "sampling seed")
    device: str | None = option(None, "cpu, cuda, cuda:1 (default: cuda if any)")
    allow_unverified: bool = option(False, ALLOW_HELP)

    def check(self) -> None:
        problems = [
            f"--{name} must be > 0, got {getattr(self, name)}"
            for name in ("max_new_tokens", "num_samples")
            if getattr(self, name) < 1
        ]
        if self.temperature < 0 or self.top_k < 0:
            problems.append("--temperature and --top_k must be >= 0")
        if problems:
            raise ConfigError(problems, source="tools/sample.py")


def main(argv: list[str] | None = None) -> int:
    opts = parse(SampleOptions, argv, description=__doc__)
    return run_tool(lambda: sample(opts))


def sample(opts: SampleOptions) -> int:
    opts.check()
    import torch

    from gpt_ds.export.sampling import generate, load_model

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_model(opts.model, opts.tag, device, opts.allow_unverified)
    print(f"loaded {loaded.source}", file=sys.stderr)
    samples = generate(
        loaded.model,
        opts.prompt,
        max_new_tokens=opts.max_new_tokens,
        temperature=opts.temperature,
        top_k=opts.top_k,
        num_samples=opts.num_samples,
        seed=opts.seed,
    )
    for text in samples:
        print(text)
        print(SEPARATOR, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
