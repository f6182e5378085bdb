"""GPT-2 with DeepSpeed's Muon: the optimizer section `--optimizer` writes, Muon's defaults,
and the checks only a Muon run needs. Imported only when a run asks for Muon or `--optimizer`.

DeepSpeed 0.19's `"optimizer": {"type": "Muon"}` (MuonWithAuxAdam) updates each parameter tagged
`use_muon` with Muon (Nesterov momentum, then a Newton-Schulz orthogonalisation of the update)
and the others with an auxiliary AdamW. gpt_ds gives Muon GPT-2's hidden matrices, the attention
and MLP weights of every block (gpt2.py `is_muon_matrix`); wte (tied to the head), wpe, biases
and LayerNorm gains go to AdamW, as the Muon recipes do.

Defaults, from Keller Jordan's Muon (github.com/KellerJordan/Muon, its `MuonWithAuxAdam`
example): lr 0.02, momentum 0.95, weight decay 0.01 on the Muon half. The AdamW half keeps
gpt_ds's AdamW recipe: --lr, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on wte and wpe, none
on biases and LayerNorms. `muon_weight_decay` is gpt_ds's key: DeepSpeed reads one weight_decay
for both halves, and gpt_ds hands this one to the Muon half as its param group's own.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from gpt_ds.dsconfig.settings import ADAMW_DEFAULTS, MUON_KEYS, Resolution

if TYPE_CHECKING:
    from gpt_ds.model.gpt2 import ModelShape

MUON_DEFAULTS: dict[str, float] = {"muon_lr": 0.02, "momentum": 0.95, "muon_weight_decay": 0.01}
_SECTIONS = {  # with_optimizer deep-copies them, betas' list included
    "adamw": {"type": "AdamW", "params": {"lr": "auto", **ADAMW_DEFAULTS}},
    "muon": {
        "type": "Muon",
        "params": {"lr": "auto", **{key: "auto" for key, _ in MUON_KEYS}, **ADAMW_DEFAULTS},
    },
}
# DeepSpeed's schedules that write one absolute lr into every param group: Muon's half would
# train at AdamW's lr. WarmupCosineLR scales each group's own lr; wsd is a LambdaLR (the same).
ABSOLUTE_LR_SCHEDULES = {
    "WarmupLR": "--lr_schedule constant",
    "WarmupDecayLR": "--lr_schedule linear",
    "OneCycle": "its OneCycle scheduler",
    "LRRangeTest": "its LRRangeTest scheduler",
}


def with_optimizer(ds_config: dict, optimizer: str | None) -> dict:
    """`ds_config` with the optimizer section of `optimizer` (None: the config's own), every
    lr "auto" for the run to fill."""
    if optimizer is None:
        return ds_config
    ds_config = copy.deepcopy(ds_config)
    ds_config["optimizer"] = copy.deepcopy(_SECTIONS[optimizer])
    return ds_config


def fill_muon(r: Resolution, params: dict, schedule: str | None) -> None:
    """Fill a Muon section's settings from the flags or Muon's defaults, and check what only
    Muon needs; `r`, the resolution, collects both."""
    for key, field in MUON_KEYS:
        where = f"optimizer.params.{key}"
        params[key], _ = r.pick(where, params.get(key), field, MUON_DEFAULTS[key])
    if "adam_lr" in params:
        r.problems.append(
            "optimizer.params.adam_lr: gpt_ds sets the AdamW half's lr from optimizer.params.lr "
            "(or --lr); remove adam_lr"
        )
    if schedule in ABSOLUTE_LR_SCHEDULES:
        r.problems.append(
            f"the Muon optimizer with scheduler {schedule} ({ABSOLUTE_LR_SCHEDULES[schedule]}): "
            "it sets one lr in every param group, so Muon's half would train at AdamW's lr; use "
            "--lr_schedule cosine or wsd, which scale each half's own lr"
        )
    zero = r.ds_config.get("zero_optimization", {})
    if zero.get("stage") == 3 and zero.get("reduce_scatter", True):
        zero["reduce_scatter"] = False  # DeepSpeed's stage 3 raises on Muon with it
        r.notes.append(
            "zero_optimization.reduce_scatter: false (Muon under ZeRO-3: each rank orthogonalises "
            "whole gradients, which DeepSpeed's stage 3 gathers by all-reduce)"
        )
    r.notes.append(
        f"optimizer: Muon on the hidden matrices: lr {params['muon_lr']}, momentum "
        f"{params['momentum']}, weight decay {params['muon_weight_decay']}; AdamW on the rest: "
        f"lr {params['lr']}, betas {params.get('betas')}, weight decay "
        f"{params.get('weight_decay')} on wte and wpe, 0 on biases and LayerNorms"
    )


def flags_without_muon(r: Resolution) -> None:
    """A Muon flag given to a run whose optimizer is not Muon: a problem, not ignored."""
    given = [r.run.flag(field) for _, field in MUON_KEYS if getattr(r.run, field) is not None]
    if given:
        r.problems.append(
            f"{', '.join(given)} set the Muon optimizer's half, and this run's optimizer is not "
            'Muon: add --optimizer muon (or "type": "Muon" in the config), or drop them'
        )


def split_line(shape: ModelShape) -> str:
    """Which of GPT-2's parameters each half updates, counted from the model's shape."""
    e, layers = shape.n_embd, shape.n_layer
    hidden = 12 * e * e * layers  # c_attn 3e², attn.c_proj e², mlp.c_fc 4e², mlp.c_proj 4e²
    embeddings = (shape.vocab_size + shape.block_size) * e
    vectors = shape.num_params() - hidden - embeddings  # biases and LayerNorms, ln_f's too
    return (
        f"optimizer split: Muon {4 * layers} hidden matrices ({_millions(hidden)} parameters); "
        f"AdamW wte and wpe ({_millions(embeddings)}) and {8 * layers + 2} biases and LayerNorm "
        f"tensors ({_millions(vectors)})"
    )


def _millions(count: int) -> str:
    return f"{count / 1e6:.2f}M"
