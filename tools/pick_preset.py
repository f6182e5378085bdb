"""Pick the ZeRO preset for your hardware: memory, traffic and time of every candidate.

    python tools/pick_preset.py --model gpt2-xl --gpus_per_node 4 --gpu_memory_gb 32 \\
        --cpu_memory_gb 256 --global_batch_size 64 --precision bf16

Prints one row per candidate (stage 0 / ZeRO-1 / ZeRO-2 / ZeRO-2 + optimizer offload /
ZeRO-3 / ZeRO-3 + optimizer & parameter offload, each with and without activation
checkpointing), one recommendation with its ds_configs/ preset and launch command, and the
assumptions behind the numbers. `--json` prints the same as JSON. The model is in
gpt_ds/memory.py. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpt_ds.errors import ConfigError
from gpt_ds.memory import (
    DEFAULT_INTRA_NODE_GBPS,
    DEFAULT_NETWORK_GBPS,
    DEFAULT_PCIE_GBPS,
    Hardware,
    format_plan,
    plan,
)
from gpt_ds.model import GPT2_VOCAB_SIZE, MODEL_PRESETS, ModelShape, resolve_shape


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Recommend a DeepSpeed ZeRO preset for a GPT-2 size and a cluster.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    m = p.add_argument_group("model: a preset, or all of --n_layer/--n_head/--n_embd")
    m.add_argument("--model", help="preset: " + ", ".join(MODEL_PRESETS))
    m.add_argument("--n_layer", type=int, help="number of layers (overrides the preset's)")
    m.add_argument("--n_head", type=int, help="attention heads (overrides the preset's)")
    m.add_argument("--n_embd", type=int, help="embedding width (overrides the preset's)")
    m.add_argument("--block_size", type=int, help="context length (default: preset's, or 1024)")
    h = p.add_argument_group("hardware")
    h.add_argument("--gpus_per_node", type=int, required=True, help="GPUs in each node")
    h.add_argument("--nodes", type=int, default=1, help="number of nodes")
    h.add_argument("--gpu_memory_gb", type=float, required=True, help="memory per GPU, GiB")
    h.add_argument("--cpu_memory_gb", type=float, help="RAM per node, GiB (unchecked if absent)")
    h.add_argument(
        "--network_gbps",
        type=float,
        help=f"inter-node bandwidth per node, Gbit/s (default {DEFAULT_NETWORK_GBPS:g})",
    )
    h.add_argument(
        "--intra_node_gbps",
        type=float,
        default=DEFAULT_INTRA_NODE_GBPS,
        help="GPU-to-GPU bandwidth inside a node, per GPU, Gbit/s (PCIe-only servers: ~150)",
    )
    h.add_argument(
        "--pcie_gbps", type=float, default=DEFAULT_PCIE_GBPS, help="GPU-CPU link, Gbit/s"
    )
    h.add_argument(
        "--gpu_tflops",
        type=float,
        help="achieved TFLOP/s per GPU (default 100 for bf16/fp16, 25 for fp32)",
    )
    t = p.add_argument_group("training")
    t.add_argument(
        "--global_batch_size", type=int, required=True, help="sequences per optimizer step"
    )
    t.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return p


def shape_from_args(args: argparse.Namespace) -> ModelShape:
    """The model's shape from a preset (with overrides) or from explicit sizes."""
    dims = (args.n_layer, args.n_head, args.n_embd)
    sizes = {
        "n_layer": dims[0],
        "n_head": dims[1],
        "n_embd": dims[2],
        "block_size": args.block_size,
    }
    problems = [f"--{n} must be >= 1, got {v}" for n, v in sizes.items() if v is not None and v < 1]
    if args.model is not None and args.model not in MODEL_PRESETS:
        problems.append(
            f"--model {args.model!r} is not a preset; choose one of {', '.join(MODEL_PRESETS)}"
        )
    if args.model is None and None in dims:
        problems.append("give --model PRESET, or all of --n_layer, --n_head and --n_embd")
    if problems:
        raise ConfigError(problems, source="pick_preset")
    if args.model is None:
        n_layer, n_head, n_embd = dims
        shape = ModelShape(n_layer, n_head, n_embd, args.block_size or 1024, GPT2_VOCAB_SIZE)
    else:
        shape = resolve_shape(args.model, *dims, args.block_size)
    if shape.n_embd % shape.n_head:
        raise ConfigError(
            f"n_embd {shape.n_embd} is not divisible by n_head {shape.n_head}",
            source="pick_preset",
        )
    return shape


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        shape = shape_from_args(args)
        hardware = Hardware(
            gpus_per_node=args.gpus_per_node,
            nodes=args.nodes,
            gpu_memory_gb=args.gpu_memory_gb,
            cpu_memory_gb=args.cpu_memory_gb,
            network_gbps=args.network_gbps,
            intra_node_gbps=args.intra_node_gbps,
            pcie_gbps=args.pcie_gbps,
            gpu_tflops=args.gpu_tflops,
        )
        result = plan(
            shape,
            hardware,
            global_batch_size=args.global_batch_size,
            precision=args.precision,
            model_name=args.model,
        )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_plan(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
