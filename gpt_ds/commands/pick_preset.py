"""Pick the ZeRO preset for your hardware: memory, traffic and time of every candidate.

    gpt-ds-pick-preset --model gpt2-xl --gpus_per_node 4 --gpu_memory_gb 32 \\
        --cpu_memory_gb 256 --global_batch_size 64 --precision bf16

(`python tools/pick_preset.py ...` in a checkout is the same command.)

Prints one row per candidate (stage 0 / ZeRO-1 / ZeRO-2 / ZeRO-2 + optimizer offload /
ZeRO-3 / ZeRO-3 + optimizer & parameter offload, each with and without activation
checkpointing), one recommendation with its ds_configs/ preset and launch command, and the
assumptions behind the numbers. `--json` prints the same as JSON. The model is in
gpt_ds/memory/ (picker.py: the candidates and the rule; estimate.py: the memory); this module
holds the flags and builds the launch command. Exit status 2 on bad input.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass

from gpt_ds.base.cli import option, parse, preset_arg, run_tool, train_script
from gpt_ds.base.errors import ConfigError
from gpt_ds.memory.choice_text import format_choice
from gpt_ds.memory.picker import (
    DEFAULT_INTRA_NODE_GBPS,
    DEFAULT_NETWORK_GBPS,
    DEFAULT_PCIE_GBPS,
    Candidate,
    Hardware,
    PresetChoice,
    choose_preset,
)
from gpt_ds.model.gpt2 import MODEL_PRESETS, ModelShape
from gpt_ds.run.init_source import init_shape, resolve_init

_MODEL = "model: a preset, or all of --n_layer/--n_head/--n_embd"
_HARDWARE = "hardware"
_TRAINING = "training"


@dataclass(frozen=True)
class RunArgs:
    """train.py flags the picker passes through to its command: fine-tuning's weights and lr."""

    init_from: str | None = None
    block_size: int | None = None
    lr: float | None = None
    optimizer: str = "adamw"

    def model_flags(self) -> list[str]:
        """--init_from (train.py takes the shape from the weights), or nothing."""
        if self.init_from is None:
            return []
        return ["--init_from", self.init_from] + (
            ["--block_size", str(self.block_size)] if self.block_size else []
        )

    def train_flags(self) -> list[str]:
        flags = ["--optimizer", "muon"] if self.optimizer == "muon" else []
        return flags + (["--lr", f"{self.lr:g}"] if self.lr is not None else [])


def model_flags(shape: ModelShape, model_name: str | None) -> list[str]:
    """train.py flags that rebuild `shape`: the preset plus any field that differs from it."""
    name = model_name if model_name in MODEL_PRESETS else "gpt2"
    base = MODEL_PRESETS[name]
    flags = ["--model", name]
    for f in ("n_layer", "n_head", "n_embd", "block_size"):
        if getattr(shape, f) != getattr(base, f):
            flags += [f"--{f}", str(getattr(shape, f))]
    return flags


def launch_command(
    c: Candidate,
    shape: ModelShape,
    model_name: str | None,
    hw: Hardware,
    precision: str,
    run_args: RunArgs | None = None,
) -> str:
    """The deepspeed command line that trains candidate `c` on `hw` (`run_args`: the weights
    to start from, which replace the model flags, and the learning rate)."""
    launcher = (
        f"deepspeed --num_gpus {hw.gpus_per_node}"
        if hw.nodes == 1
        else "deepspeed --hostfile hostfile"
    )
    assert c.preset is not None, "only a candidate with a preset is recommended"
    parts = [launcher, train_script(), "--deepspeed_config", preset_arg(c.preset)]
    run_args = run_args or RunArgs()
    parts += run_args.model_flags() or model_flags(shape, model_name)
    parts += run_args.train_flags()
    parts += ["--precision", precision, "--micro_batch_size", str(c.micro_batch_size)]
    parts += ["--grad_accum", str(c.grad_accum)]
    if c.activation_checkpointing:
        parts.append("--activation_checkpointing")
    return " ".join(parts)


def with_command(choice: PresetChoice, run_args: RunArgs | None = None) -> PresetChoice:
    """`choice` with the launch command of its recommendation (None where nothing fits)."""
    rec = choice.recommendation
    if rec is None:
        return choice
    command = launch_command(
        rec, choice.shape, choice.model_name, choice.hardware, choice.precision, run_args
    )
    return dataclasses.replace(choice, command=command)


@dataclass(kw_only=True)
class PickPresetOptions:
    """Recommend a DeepSpeed ZeRO preset for a GPT-2 size and a cluster."""

    model: str | None = option(None, "preset: " + ", ".join(MODEL_PRESETS), group=_MODEL)
    n_layer: int | None = option(None, "number of layers (overrides the preset's)", group=_MODEL)
    n_head: int | None = option(None, "attention heads (overrides the preset's)", group=_MODEL)
    n_embd: int | None = option(None, "embedding width (overrides the preset's)", group=_MODEL)
    block_size: int | None = option(
        None, "context length (default: preset's, or 1024)", group=_MODEL
    )
    gpus_per_node: int = option(help="GPUs in each node", group=_HARDWARE)
    nodes: int = option(1, "number of nodes", group=_HARDWARE)
    gpu_memory_gb: float = option(help="memory per GPU, GiB", group=_HARDWARE)
    cpu_memory_gb: float | None = option(
        None, "RAM per node, GiB (unchecked if absent)", group=_HARDWARE
    )
    network_gbps: float | None = option(
        None,
        f"inter-node bandwidth per node, Gbit/s (default {DEFAULT_NETWORK_GBPS:g})",
        group=_HARDWARE,
    )
    intra_node_gbps: float = option(
        DEFAULT_INTRA_NODE_GBPS,
        "GPU-to-GPU bandwidth inside a node, per GPU, Gbit/s (PCIe-only servers: ~150)",
        group=_HARDWARE,
    )
    pcie_gbps: float = option(DEFAULT_PCIE_GBPS, "GPU-CPU link, Gbit/s", group=_HARDWARE)
    gpu_tflops: float | None = option(
        None, "achieved TFLOP/s per GPU (default 100 for bf16/fp16, 25 for fp32)", group=_HARDWARE
    )
    global_batch_size: int = option(help="sequences per optimizer step", group=_TRAINING)
    precision: str = option(
        "bf16", "training precision", choices=("bf16", "fp16", "fp32"), group=_TRAINING
    )
    init_from: str | None = option(
        None,
        "fine-tune these weights (a Hugging Face GPT-2 directory or hub name, or a gpt_ds "
        "run's OUT_DIR[:TAG]): the printed command loads them; the shape comes from --model / "
        "the sizes, else from the weights' config",
        group=_TRAINING,
    )
    lr: float | None = option(None, "peak learning rate for the printed command", group=_TRAINING)
    optimizer: str = option(
        "adamw",
        "the optimizer whose state is counted: adamw, or muon (train.py --optimizer muon: "
        "Muon's one momentum for the hidden matrices)",
        choices=("adamw", "muon"),
        group=_TRAINING,
    )
    json: bool = option(False, "print JSON instead of the table")

    def run_args(self) -> RunArgs:
        """The train.py flags the printed command passes through."""
        return RunArgs(
            init_from=self.init_from,
            block_size=self.block_size,
            lr=self.lr,
            optimizer=self.optimizer,
        )

    def hardware(self) -> Hardware:
        """The cluster: the options named like Hardware's fields (checked by
        `choose_preset`)."""
        return Hardware(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Hardware)})

    def model_shape(self) -> ModelShape:
        """The model: a preset with any size given overriding it, or all of the sizes given.

        Raises ConfigError for an unknown preset or missing sizes; the sizes themselves are
        checked by `choose_preset` (`gpt_ds.model.gpt2.shape_problems`), with the hardware, in
        one error.
        """
        given = {
            name: getattr(self, name)
            for name in ("n_layer", "n_head", "n_embd", "block_size")
            if getattr(self, name) is not None
        }
        problems = []
        if self.model is not None and self.model not in MODEL_PRESETS:
            problems.append(
                f"--model {self.model!r} is not a preset; choose one of {', '.join(MODEL_PRESETS)}"
            )
        if self.model is None and self.init_from and not {"n_layer", "n_embd"} & given.keys():
            # the manifest's shape only: no bytes loaded, none to verify
            return init_shape(resolve_init(self.init_from, allow_unverified=True), self.block_size)
        if self.model is None and not {"n_layer", "n_head", "n_embd"} <= given.keys():
            problems.append("give --model PRESET, or all of --n_layer, --n_head and --n_embd")
        if problems:
            raise ConfigError(problems, source="pick_preset")
        if self.model is None:
            return ModelShape(**given)  # block_size 1024 unless given, GPT-2's vocabulary
        return dataclasses.replace(MODEL_PRESETS[self.model], **given)


def main(argv: list[str] | None = None) -> int:
    options = parse(PickPresetOptions, argv)

    def pick() -> int:
        choice = choose_preset(
            options.model_shape(),
            options.hardware(),
            global_batch_size=options.global_batch_size,
            precision=options.precision,
            model_name=options.model,
            optimizer=options.optimizer,
        )
        choice = with_command(choice, options.run_args())
        print(json.dumps(choice.to_dict(), indent=2) if options.json else format_choice(choice))
        return 0

    return run_tool(pick)


if __name__ == "__main__":
    sys.exit(main())
