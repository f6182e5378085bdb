"""The consolidated weights of a training run's checkpoint, as DeepSpeed's own converter
gathers them: the reference a bit-identical comparison of runs reads."""

from __future__ import annotations

import json


def consolidated_model(out_dir, tag: str):
    """GPT2LMHeadModel holding the fp32 weights DeepSpeed's own converter gathers from `tag`;
    of a run with a padded vocabulary, the tokenizer's rows only (GPT-2's own shape: the
    padding rows are never predicted, so the model without them computes the same loss)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import GPT2Config, GPT2LMHeadModel

    manifest = json.loads((out_dir / tag / "gpt_ds.json").read_text())
    m = manifest["model"]
    tokens = m.get("token_vocab_size") or m["vocab_size"]
    config = GPT2Config(
        vocab_size=tokens,
        n_positions=m["block_size"],
        n_embd=m["n_embd"],
        n_layer=m["n_layer"],
        n_head=m["n_head"],
    )
    model = GPT2LMHeadModel(config)
    state = get_fp32_state_dict_from_zero_checkpoint(str(out_dir), tag=tag)
    for name in ("transformer.wte.weight", "lm_head.weight"):
        if name in state:
            state[name] = state[name][:tokens]
    model.load_state_dict(state, strict=False)
    return model.eval()
