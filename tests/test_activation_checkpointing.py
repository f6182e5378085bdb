"""`--activation_checkpointing`, proven: each block's forward runs again in backward
(gpt_ds.model.gpt2.enable_activation_checkpointing, counted in one process) and changes no number,
and real 2-rank runs with it under ZeRO-1/2/3 train as the same runs without it (dropout 0,
fp32: losses and weights equal to float rounding; helpers.compared_runs). Its memory saving is
measured by benchmarks/activation_checkpointing.py (BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch
from helpers.compared_runs import WHOLE, assert_losses_close, assert_weights_close
from transformers import GPT2Config, GPT2LMHeadModel

from gpt_ds.model.gpt2 import enable_activation_checkpointing


def tiny_model(checkpointing: bool) -> tuple[GPT2LMHeadModel, list[int]]:
    """A 2-layer GPT-2 (seeded) and a list counting the forward calls of its first block's
    attention (inside the block: transformers checkpoints the block's `forward`, so the block's
    own hooks stay outside the recomputation, and torch stops recomputing once the tensors
    backward needs are back, before the block's last modules)."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    model = GPT2LMHeadModel(config).train()
    if checkpointing:
        enable_activation_checkpointing(model)
    calls = [0]
    model.transformer.h[0].attn.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return model, calls


def test_blocks_are_recomputed_in_backward_with_the_same_gradients():
    ids = torch.randint(0, 97, (4, 32), generator=torch.Generator().manual_seed(1))
    grads = {}
    for checkpointing in (False, True):
        model, calls = tiny_model(checkpointing)
        loss = model(input_ids=ids, labels=ids).loss
        assert calls[0] == 1
        loss.backward()
        assert calls[0] == (2 if checkpointing else 1)  # recomputed in backward, or kept
        grads[checkpointing] = (loss.item(), [p.grad.clone() for p in model.parameters()])
    (loss_off, g_off), (loss_on, g_on) = grads[False], grads[True]
    assert loss_on == loss_off
    for a, b in zip(g_off, g_on, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_run_with_activation_checkpointing_trains_as_one_without(stage, runs):
    plain = runs(stage, **WHOLE)
    recomputed = runs(stage, **WHOLE, activation_checkpointing=True)
    assert_losses_close(recomputed, plain)
    assert_weights_close(recomputed, plain)
