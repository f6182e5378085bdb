"""Building GPT-2 under ZeRO-3 without a whole copy on any rank.

Under ZeRO-3 every parameter is partitioned as soon as its module is constructed
(`deepspeed.zero.Init`), so a rank only ever holds its shard (an 8-GPU node building GPT-2 XL
otherwise holds 8 full fp32 copies, ~50 GB, before DeepSpeed partitions them). A fresh model is
then initialised the way transformers does it under its DeepSpeed integration: module by module,
each module's parameters gathered, rank 0 drawing the values, then re-partitioned. Pretrained
weights go through transformers' own ZeRO-3 loading (`hf_zero3`).

training_model.py's `fresh_model` builds without transformers' constructor-time init (under
`deepspeed.zero.Init` here) and then initialises once from the caller's seed
(`initialize_weights_zero3` here), so the partitioned model's weights equal an unpartitioned
build's with the same seed (the RNG draws the same values in the same order on rank 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def hf_zero3(ds_config: dict) -> Iterator[None]:
    """While open, transformers sees a ZeRO-3 run (its `is_deepspeed_zero3_enabled`): models it
    builds or loads are partitioned."""
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    keep = HfDeepSpeedConfig(ds_config)  # transformers holds a weak reference to it
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del keep


def initialize_weights_zero3(model) -> None:
    """transformers' `initialize_weights` on a partitioned model: each module's parameters and
    its direct children's gathered, rank 0 drawing, sub-models dispatched to their own init.

    transformers has its own (`integrations.deepspeed.initialize_weights_zero3`), but before
    5.23 it gathered only a module's own parameters, so GPT2Attention's and GPT2MLP's re-draw of
    their child `c_proj` (GPT-2's scaled init, std 0.02/sqrt(2 x n_layer)) ran on an empty shard
    and silently kept std 0.02 (seen on an H200 node with 5.17). This is 5.23's, on the
    transformers 5 methods it calls (`_initialize_weights`, `guard_torch_init_functions`), so
    every transformers gpt_ds installs with gives the same weights.
    """
    import deepspeed
    from transformers.initialization import guard_torch_init_functions
    from transformers.modeling_utils import PreTrainedModel

    is_remote_code = model.is_remote_code()

    def init(module: torch.nn.Module, fn) -> None:
        for child in module.children():
            init(child, child._initialize_weights if isinstance(child, PreTrainedModel) else fn)
        params = list(module.parameters(recurse=False))
        for child in module.children():  # _init_weights may draw a direct child's weights
            if not isinstance(child, PreTrainedModel):
                params.extend(child.parameters(recurse=False))
        if not params:
            fn(module, is_remote_code)
            return
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            if deepspeed.comm.get_rank() == 0:
                fn(module, is_remote_code)

    with torch.no_grad(), guard_torch_init_functions():
        init(model, model._initialize_weights)
