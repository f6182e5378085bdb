"""Pick the ZeRO preset for your hardware: memory, traffic and time of every candidate.

    gpt-ds-pick-preset --model gpt2-xl --gpus_per_node 4 --gpu_memory_gb 32 \\
        --cpu_memory_gb 256 --global_batch_size 64 --precision bf16

(`python tools/pick_preset.py ...` in a checkout is the same command.)

Prints one row per candidate (stage 0 / ZeRO-1 / ZeRO-2 / ZeRO-2 + optimizer offload /
ZeRO-3 / ZeRO-3 + optimizer & parameter offload, each with and without activation
checkpointing), one recommendation with its ds_configs/ preset and launch command, and the
assumptions behind the numbers. `--json` prints the same as JSON. The model is in
gpt_ds/memory/ (options.py: these flags; picker.py: the candidates and the rule; estimate.py:
the memory). Exit status 2 on bad input.
"""

from __future__ import annotations

import json
import sys

from gpt_ds.cli import parse, run_tool
from gpt_ds.memory import PickPresetOptions, format_plan, plan


def main(argv: list[str] | None = None) -> int:
    options = parse(PickPresetOptions, argv)

    def pick() -> int:
        result = plan(
            options.model_shape(),
            options.hardware(),
            global_batch_size=options.global_batch_size,
            precision=options.precision,
            model_name=options.model,
            run_args=options.run_args(),
        )
        print(json.dumps(result.to_dict(), indent=2) if options.json else format_plan(result))
        return 0

    return run_tool(pick)


if __name__ == "__main__":
    sys.exit(main())
