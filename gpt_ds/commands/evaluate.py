"""Score a trained GPT-2 on HellaSwag: a training checkpoint (any tag) or an exported folder.

    gpt-ds-eval --model out/ --hellaswag hellaswag_val.jsonl                # latest tag
    gpt-ds-eval --model out/ --tag iter_2000 --hellaswag hellaswag_val.jsonl
    gpt-ds-eval --model export/ --hellaswag hellaswag_val.jsonl
    deepspeed --num_gpus 8 --module gpt_ds.commands.evaluate --model out/ --hellaswag ...

(`python tools/evaluate.py ...` in a checkout is the same command.) Scores as the trainer's
`--hellaswag` does (docs/evaluation.md): acc_norm, acc, the examples scored and the time, on
stdout. Launched on several ranks, each holds the whole model and scores its share of the
examples; the figures are the same on any number. A checkpoint is consolidated in memory with
the export code (gpt-ds-export's), in fp32.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpt_ds.base.cli import option, parse, run_tool
from gpt_ds.checkpoint.integrity import ALLOW_HELP

if TYPE_CHECKING:
    from gpt_ds.data.hellaswag import Example


@dataclass
class EvalOptions:
    model: str = option(help="exported HF directory, training out dir or tag dir")
    hellaswag: str = option(help="HellaSwag's validation file (hellaswag_val.jsonl)")
    tag: str | None = option(None, "checkpoint tag (default: the one `latest` names)")
    allow_unverified: bool = option(False, ALLOW_HELP)
    # the launcher passes --local_rank=N (newer ones --local-rank)
    local_rank: int = option(
        -1, "Set by the DeepSpeed launcher.", aliases=("--local-rank",), hidden=True
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse(EvalOptions, argv, description=__doc__)
    return run_tool(lambda: evaluate(opts))


def evaluate(opts: EvalOptions) -> int:
    """Read and check the file first (a malformed line costs no model load), then score. A
    bad file or model is found alike on every rank: said once per node (dist.refuse)."""
    from gpt_ds.base import dist
    from gpt_ds.base.errors import GptDsError
    from gpt_ds.base.launcher_world import adopt_launcher_world
    from gpt_ds.data.hellaswag import read_hellaswag

    adopt_launcher_world()  # mpirun/srun ranks: RANK, WORLD_SIZE before the group
    try:
        examples = read_hellaswag(opts.hellaswag)
    except GptDsError as exc:
        return dist.refuse(exc)
    launched = dist.world_size() > 1
    if launched:
        dist.init()
    try:
        return _score(opts, examples)
    except GptDsError as exc:
        return dist.refuse(exc)
    finally:
        if launched:
            dist.shutdown()


def _score(opts: EvalOptions, examples: list[Example]) -> int:
    from gpt_ds.base import dist
    from gpt_ds.data.hellaswag import render_all
    from gpt_ds.export.sampling import load_model
    from gpt_ds.training.hellaswag import score_hellaswag

    device = dist.device()
    loaded = load_model(opts.model, opts.tag, str(device), opts.allow_unverified)
    block = loaded.model.config.n_positions
    data = render_all(examples, block, opts.hellaswag)
    if dist.is_main():
        print(f"loaded {loaded.source}; block {block}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = score_hellaswag(
        loaded.model,
        data,
        device,
        rank=dist.rank(),
        world_size=dist.world_size(),
        progress=True,
    )
    if dist.is_main():
        ranks = dist.world_size()
        took = time.perf_counter() - start
        print(f"{result.line()} | {ranks} rank{'s' if ranks > 1 else ''} | {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
