"""The options of tools/pick_preset.py: one dataclass, the command line generated from it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpt_ds.cli import option
from gpt_ds.errors import ConfigError
from gpt_ds.init_source import init_shape, resolve_init
from gpt_ds.memory.hardware import (
    DEFAULT_INTRA_NODE_GBPS,
    DEFAULT_NETWORK_GBPS,
    DEFAULT_PCIE_GBPS,
    Hardware,
)
from gpt_ds.memory.picker import RunArgs
from gpt_ds.model import MODEL_PRESETS, ModelShape

_MODEL = "model: a preset, or all of --n_layer/--n_head/--n_embd"
_HARDWARE = "hardware"
_TRAINING = "training"


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
    json: bool = option(False, "print JSON instead of the table")

    def run_args(self) -> RunArgs:
        """The train.py flags the printed command passes through."""
        return RunArgs(init_from=self.init_from, block_size=self.block_size, lr=self.lr)

    def hardware(self) -> Hardware:
        """The cluster: the options named like Hardware's fields (checked by `plan`)."""
        return Hardware(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Hardware)})

    def model_shape(self) -> ModelShape:
        """The model: a preset with any size given overriding it, or all of the sizes given.

        Raises ConfigError for an unknown preset or missing sizes; the sizes themselves are
        checked by `plan` (`gpt_ds.model.shape_problems`), with the hardware, in one error.
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
            return init_shape(resolve_init(self.init_from), self.block_size)
        if self.model is None and not {"n_layer", "n_head", "n_embd"} <= given.keys():
            problems.append("give --model PRESET, or all of --n_layer, --n_head and --n_embd")
        if problems:
            raise ConfigError(problems, source="pick_preset")
        if self.model is None:
            return ModelShape(**given)  # block_size 1024 unless given, GPT-2's vocabulary
        return dataclasses.replace(MODEL_PRESETS[self.model], **given)
