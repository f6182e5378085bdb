"""Memory and communication model for GPT-2 under DeepSpeed ZeRO (0.19), and the preset picker.

One module per job; dependencies flow down this list, and nothing here imports the trainer:

* `constants`: GiB and bytes per element of each precision.
* `settings`: `ZeroSettings`, the zero_optimization sizes that cost memory, and
  `DeepSpeedRun`, the rest of a run that does (the estimate's input).
* `layout`: GPT-2's parameter tensors and ZeRO's partition of them per rank.
* `activations`: what autograd keeps for backward.
* `estimate`: `estimate_run` -> `MemoryEstimate`, per GPU and per node's CPU (the accounting
  is written out in that module's docstring); the trainer's start-up estimate.
* `communication`: bytes each GPU sends per optimizer step, and the seconds that takes.
* `measure`: `measured_model_state_bytes` of a live engine, through DeepSpeed's internals.
* `hardware`: `Hardware`, the cluster a plan is for, and how much of its memory a plan may use.
* `picker`: the candidates (the ds_configs/ presets, resolved as the trainer resolves them),
  `choose_preset` -> `PresetChoice` (fit, batch split, traffic, time, recommendation).
* `choice_text`: `format_choice`, a choice as the text `tools/pick_preset.py` prints.

The names below are the package's public interface: import them from `gpt_ds.memory`.
"""

from __future__ import annotations

from gpt_ds.memory.activations import (
    ACT_BYTES_PER_SBH_16BIT,
    EAGER_ATTN_BYTES_PER_ASSB,
    KORTHIKANTI_SBH,
    LOGIT_BYTES_PER_ELEMENT,
    activation_bytes,
)
from gpt_ds.memory.choice_text import format_choice
from gpt_ds.memory.communication import (
    comm_bytes_per_step,
    comm_seconds,
    grad_comm_bytes_per_step,
)
from gpt_ds.memory.constants import PRECISION_BYTES, GiB
from gpt_ds.memory.estimate import CPU_BYTES_PER_RANK, MemoryEstimate, estimate_run
from gpt_ds.memory.hardware import (
    CPU_USABLE_FRACTION,
    CUDA_CONTEXT_BYTES,
    DEFAULT_INTRA_NODE_GBPS,
    DEFAULT_NETWORK_GBPS,
    DEFAULT_PCIE_GBPS,
    GPU_USABLE_FRACTION,
    Hardware,
)
from gpt_ds.memory.layout import largest_module_params, parameter_layout
from gpt_ds.memory.measure import measured_model_state_bytes
from gpt_ds.memory.picker import (
    CANDIDATES,
    CPU_ADAM_PARAMS_PER_S,
    DEFAULT_GPU_TFLOPS,
    DS_CONFIG_DIR,
    MAX_MICRO_BATCH,
    RECOMPUTE_FACTOR,
    RULE,
    TIE_FRACTION,
    Candidate,
    PresetChoice,
    assumptions,
    candidate_name,
    choose_preset,
    preset_run,
)
from gpt_ds.memory.settings import DeepSpeedRun, ZeroSettings

__all__ = [
    "ACT_BYTES_PER_SBH_16BIT",
    "CANDIDATES",
    "CPU_ADAM_PARAMS_PER_S",
    "CPU_BYTES_PER_RANK",
    "CPU_USABLE_FRACTION",
    "CUDA_CONTEXT_BYTES",
    "DEFAULT_GPU_TFLOPS",
    "DEFAULT_INTRA_NODE_GBPS",
    "DEFAULT_NETWORK_GBPS",
    "DEFAULT_PCIE_GBPS",
    "DS_CONFIG_DIR",
    "EAGER_ATTN_BYTES_PER_ASSB",
    "GPU_USABLE_FRACTION",
    "KORTHIKANTI_SBH",
    "LOGIT_BYTES_PER_ELEMENT",
    "MAX_MICRO_BATCH",
    "PRECISION_BYTES",
    "RECOMPUTE_FACTOR",
    "RULE",
    "TIE_FRACTION",
    "Candidate",
    "DeepSpeedRun",
    "GiB",
    "Hardware",
    "MemoryEstimate",
    "PresetChoice",
    "ZeroSettings",
    "activation_bytes",
    "assumptions",
    "candidate_name",
    "choose_preset",
    "comm_bytes_per_step",
    "comm_seconds",
    "estimate_run",
    "format_choice",
    "grad_comm_bytes_per_step",
    "largest_module_params",
    "measured_model_state_bytes",
    "parameter_layout",
    "preset_run",
]
