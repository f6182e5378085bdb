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
import re
from collections.abc import Iterator

import torch

# transformers' initialize_weights_zero3 gathers a module's children's parameters for its
# _init_weights from 5.23 on; before, GPT2Attention/GPT2MLP's re-draw of their child c_proj ran
# on an empty shard, so GPT-2's scaled init of the residual projections silently never happened
# (seen on an H200 node with 5.17; the fix is in transformers/integrations/deepspeed.py, 5.23).
ZERO3_INIT_MIN_TRANSFORMERS = (5, 23)


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


def zero3_init_problem(transformers_version: str) -> str | None:
    """Why a fresh GPT-2 built partitioned under ZeRO-3 with this transformers would not get
    GPT-2's initialisation, with the fix; None when it would."""
    found = re.match(r"(\d+)\.(\d+)", transformers_version)
    if found is None or (int(found[1]), int(found[2])) >= ZERO3_INIT_MIN_TRANSFORMERS:
        return None
    need = ".".join(map(str, ZERO3_INIT_MIN_TRANSFORMERS))
    return (
        f"a fresh model under ZeRO-3 needs transformers >= {need}: {transformers_version}'s "
        "ZeRO-3 initialisation skips GPT-2's scaled init of the residual projections (c_proj "
        f"std 0.02 instead of 0.02/sqrt(2 x n_layer)). Fix: pip install -U 'transformers>={need}'"
        " (or start from a checkpoint, --init_from, or another ZeRO stage)"
    )


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
