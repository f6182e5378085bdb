"""Building GPT-2 under ZeRO-3 without a whole copy on any rank.

Under ZeRO-3 every parameter is partitioned as soon as its module is constructed
(`deepspeed.zero.Init`), so a rank only ever holds its shard (an 8-GPU node building GPT-2 XL
otherwise holds 8 full fp32 copies, ~50 GB, before DeepSpeed partitions them). A fresh model is
then initialised the way transformers does it under its DeepSpeed integration: module by module,
each module's parameters gathered, rank 0 drawing the values, then re-partitioned. Pretrained
weights go through transformers' own ZeRO-3 loading (`hf_zero3`).

Both paths of `fresh_model` build without transformers' constructor-time init and then
initialise once from the caller's seed, so the partitioned model's weights equal an unpartitioned
build's with the same seed (the RNG draws the same values in the same order on rank 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def hf_zero3(ds_config: dict | None) -> Iterator[None]:
    """While open, transformers sees a ZeRO-3 run (its `is_deepspeed_zero3_enabled`): models it
    builds or loads are partitioned. No-op for None."""
    if ds_config is None:
        yield
        return
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    keep = HfDeepSpeedConfig(ds_config)  # transformers holds a weak reference to it
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del keep


def fresh_model(cls: type, config, zero3_config: dict | None) -> torch.nn.Module:
    """`cls(config)` with GPT-2's initialisation, partitioned when `zero3_config` is given."""
    from transformers.initialization import no_init_weights

    with contextlib.ExitStack() as stack:
        stack.enter_context(no_init_weights())  # no throw-away draws in the constructors
        if zero3_config is not None:
            import deepspeed

            stack.enter_context(deepspeed.zero.Init(config_dict_or_path=zero3_config))
        model = cls(config)
    with torch.no_grad():
        if zero3_config is None:
            model.initialize_weights()
        else:
            from transformers.integrations.deepspeed import initialize_weights_zero3

            initialize_weights_zero3(model)
    model.tie_weights()
    return model
